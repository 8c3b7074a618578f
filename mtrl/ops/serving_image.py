"""The container a SageMaker endpoint serves an open-weights model with: AWS's vLLM Deep Learning
Container for SageMaker (Amazon Linux 2023, `vllm:server-sagemaker-cuda-v<version>`), which turns
`SM_VLLM_*` variables into vLLM server flags and serves the OpenAI API on /invocations (AWS DLC
documentation, vllm/deployment/sagemaker.md and vllm/configuration.md).

Its registry per region is the one the SageMaker Python SDK resolves it from (sagemaker-core
2.27.0, `image_uri_config/vllm-server.json`, version 2.6: tests/mtrl/test_serving_image.py
compares every region); the Deep Learning Containers' own account where a region has one.
"""

from __future__ import annotations

VERSION = "2.6"
REPOSITORY = "vllm"
TAG = f"server-sagemaker-cuda-v{VERSION}"
# CUDA 13 (the DLC's v2 changelog: NVIDIA driver 580 or later): the host AMI with that driver
# (botocore's SageMaker model, ProductionVariant `InferenceAmiVersion`).
HOST_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"

_SHARED_REGISTRY = "763104351884"
_SHARED = (
    "ap-northeast-1", "ap-northeast-2", "ap-south-1", "ap-southeast-1", "ap-southeast-2",
    "ca-central-1", "eu-central-1", "eu-north-1", "eu-west-1", "eu-west-2", "eu-west-3",
    "sa-east-1", "us-east-1", "us-east-2", "us-west-1", "us-west-2",
)  # fmt: skip
_OWN_REGISTRY = {
    "af-south-1": "626614931356", "ap-east-1": "871362719292", "ap-east-2": "975050140332",
    "ap-northeast-3": "364406365360", "ap-south-2": "772153158452",
    "ap-southeast-3": "907027046896", "ap-southeast-4": "457447274322",
    "ap-southeast-5": "550225433462", "ap-southeast-6": "633930458069",
    "ap-southeast-7": "590183813437", "ca-west-1": "204538143572", "eu-central-2": "380420809688",
    "eu-south-1": "692866216735", "eu-south-2": "503227376785", "il-central-1": "780543022126",
    "me-central-1": "914824155844", "me-south-1": "217643126080", "me-west-1": "124382933778",
    "mx-central-1": "637423239942",
}  # fmt: skip
REGISTRIES = {**dict.fromkeys(_SHARED, _SHARED_REGISTRY), **_OWN_REGISTRY}


def serving_image(region: str) -> str | None:
    """The image's URI in `region`; None where AWS publishes none."""
    registry = REGISTRIES.get(region)
    if registry is None:
        return None
    return f"{registry}.dkr.ecr.{region}.amazonaws.com/{REPOSITORY}:{TAG}"
