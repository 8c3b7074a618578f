"""The vLLM serving image `mtrl deploy --to sagemaker` uses, per region, as the SageMaker Python
SDK resolves it: sagemaker-core's `image_uri_config/vllm-server.json` (installed without its
dependencies by `make test`), whose registries, repository and tag `image_uris.retrieve` builds
an inference image's URI from (`<registry>.dkr.ecr.<region>.amazonaws.com/<repository>:
<tag_prefix>-<container_version[processor]>`)."""

from __future__ import annotations

import json
import re
from importlib.metadata import PackageNotFoundError, distribution
from typing import Any

import botocore.session
import pytest

from mtrl.ops.serving_image import HOST_AMI, REGISTRIES, VERSION, serving_image

SDK_VERSION = "2.27.0"


def sdk_config() -> dict[str, Any]:
    try:
        package = distribution("sagemaker-core")
    except PackageNotFoundError:
        pytest.fail("sagemaker-core is not installed: run `make test` (it installs it --no-deps)")
    assert package.version == SDK_VERSION, f"pinned against {SDK_VERSION}, found {package.version}"
    path = package.locate_file("sagemaker/core/image_uri_config/vllm-server.json")
    return json.loads(path.read_text())  # type: ignore[union-attr]


def test_every_region_the_sdk_knows_gets_the_image_the_sdk_resolves() -> None:
    config = sdk_config()
    assert config["scope"] == ["inference"]
    version = config["versions"][VERSION]
    assert version["processors"] == ["gpu"] and version["processor_in_tag"] is False
    tag = f"{version['tag_prefix']}-{version['container_version']['gpu']}"
    assert set(REGISTRIES) == set(version["registries"])
    for region, registry in version["registries"].items():
        expected = f"{registry}.dkr.ecr.{region}.amazonaws.com/{version['repository']}:{tag}"
        assert serving_image(region) == expected


def test_a_region_without_the_image_has_none() -> None:
    assert serving_image("us-gov-west-1") is None
    assert serving_image("cn-north-1") is None


def test_the_host_ami_is_sagemakers_with_the_driver_cuda_13_needs() -> None:
    """botocore's SageMaker model: `ProductionVariant.InferenceAmiVersion`'s values, and its
    documentation of each (NVIDIA driver 580 / CUDA 13.0 for this one; the v2 vLLM images are
    CUDA 13 builds, which need a 580 driver: the DLC's v2.0.0 changelog)."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    assert HOST_AMI in model.shape_for("ProductionVariantInferenceAmiVersion").enum
    documented = model.shape_for("ProductionVariant").members["InferenceAmiVersion"].documentation
    text = re.sub(r"<[^>]+>", " ", documented)
    described = text[text.index(HOST_AMI) :].split("CUDA version:")[1].split()[0]
    assert "NVIDIA driver version: 580" in text[text.index(HOST_AMI) :] and described == "13.0"
