"""The training-job renderer: golden objects for the shipped LoRA and FULL configs, schema
validation (Kubernetes' own schemas for the built-in kinds, HyperPod's CRD model for its job),
and the errors a user sees when a config and the deployment's presets do not fit."""

from __future__ import annotations

import importlib.util
import json
import os
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from domain.presets import ModelPreset
from lambdas.kubernetes.training_job import (
    RUN_LABEL,
    JobRenderError,
    JobRequest,
    node_split,
    render,
    run_namespace,
)
from stacks.config import PlatformConfig, deployment_context
from training_configs.schema import load_training_config

GOLDEN = Path(__file__).parent / "golden"
KUBERNETES_VERSION = "1.33"
PRESETS = PlatformConfig.from_context(deployment_context()).model_presets
QUEUES = {
    name: f"https://sqs.us-east-1.amazonaws.com/123456789012/nova-mtrl-wordle-0a1b2c3d4e-{name}.fifo"
    for name in ("rollout_requests", "rollout_responses", "generate_requests", "generate_responses", "dlq")
}  # fmt: skip


def request(config: str, *, model: str = "qwen3-8b", **changes: Any) -> JobRequest:
    training = load_training_config(config)
    training = training.model_copy(update={"model": model, **changes})
    return JobRequest(
        run_id="wordle-0a1b2c3d4e",
        prefix="nova-mtrl",
        config=training,
        preset=PRESETS[model],
        queues=QUEUES,
        output_uri="s3://nova-mtrl-data-123456789012/runs/wordle-0a1b2c3d4e/",
        dataset_uri="s3://nova-mtrl-data-123456789012/training-data/wordle.jsonl",
        account="123456789012",
        region="us-east-1",
    )


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [obj for obj in objects if obj["kind"] == kind]
    return found


def hyperpod_job_model() -> Any:
    """HyperPod's own pydantic model of the HyperPodPyTorchJob spec (sagemaker-hyperpod, installed
    without its dependencies by `make test`; the module needs only pydantic)."""
    try:
        package = distribution("sagemaker-hyperpod")
    except PackageNotFoundError:
        pytest.fail(
            "sagemaker-hyperpod is not installed: run `make test` (it installs it --no-deps)"
        )
    path = package.locate_file(
        "sagemaker/hyperpod/training/config/hyperpod_pytorch_job_unified_config.py"
    )
    spec = importlib.util.spec_from_file_location("hyperpod_job_config", str(path))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module._HyperPodPytorchJob


def validate(obj: dict[str, Any]) -> None:
    """Each object against its schema: built-in kinds strictly (unknown fields fail), custom
    kinds by their CRD model, and every pod template as a v1 PodTemplate."""
    if obj["kind"] == "HyperPodPyTorchJob":
        hyperpod_job_model().model_validate(obj["spec"], by_name=True)
        templates = [replica["template"] for replica in obj["spec"]["replicaSpecs"]]
    elif obj["kind"] == "PyTorchJob":
        spec = obj["spec"]
        assert set(spec) <= {"nprocPerNode", "pytorchReplicaSpecs", "runPolicy", "elasticPolicy"}
        assert set(spec["pytorchReplicaSpecs"]) <= {"Master", "Worker"}
        assert set(spec["runPolicy"]) <= {
            "activeDeadlineSeconds", "backoffLimit", "cleanPodPolicy", "managedBy",
            "schedulingPolicy", "suspend", "ttlSecondsAfterFinished",
        }  # fmt: skip
        templates = [replica["template"] for replica in spec["pytorchReplicaSpecs"].values()]
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        return
    for template in templates:
        pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
        kubernetes_validate.validate(
            {**pod_template, "template": template}, KUBERNETES_VERSION, strict=True
        )


@pytest.mark.parametrize("config", ["rft_multiturn_lora", "rft_multiturn_full"])
def test_rendered_job_matches_golden_and_validates(config: str) -> None:
    objects = render(request(config))
    for obj in objects:
        validate(obj)
    golden = GOLDEN / f"{config}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(json.dumps(objects, indent=2) + "\n")
    assert objects == json.loads(golden.read_text())


def test_kubeflow_fallback_validates_and_splits_master_and_workers() -> None:
    from dataclasses import replace

    objects = render(replace(request("rft_multiturn_full"), kind="PyTorchJob"))
    job = objects[-1]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    # The four 1-GPU vLLM replicas share one node: nine of the ten train.
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 8)
    for obj in objects:
        validate(obj)


def test_schema_validation_catches_a_misspelt_field() -> None:
    job = render(request("rft_multiturn_lora"))[-1]
    job["spec"]["runPolicy"]["jobMaxRetries"] = 0
    with pytest.raises(ValueError, match="jobMaxRetries"):
        validate(job)
    deployment = of_kind(render(request("rft_multiturn_lora")), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)


def test_every_object_is_labelled_with_the_run_and_lives_in_its_namespace() -> None:
    objects = render(request("rft_multiturn_lora"))
    namespace = run_namespace("nova-mtrl", "wordle-0a1b2c3d4e")
    assert [obj["kind"] for obj in objects] == [
        "Namespace", "ServiceAccount", "ConfigMap", "Deployment", "Service", "HyperPodPyTorchJob",
    ]  # fmt: skip
    for obj in objects:
        assert obj["metadata"]["labels"][RUN_LABEL] == "wordle-0a1b2c3d4e"
        assert obj["metadata"].get("namespace", obj["metadata"]["name"]) == namespace


def test_settings_carry_queues_recipe_and_locations_but_no_secret() -> None:
    settings = of_kind(render(request("rft_multiturn_lora")), "ConfigMap")["data"]
    assert settings["MTRL_QUEUE_ROLLOUT_REQUESTS"] == QUEUES["rollout_requests"]
    assert settings["MTRL_RECIPE"] == "grpo-lora"
    assert json.loads(settings["MTRL_HYPERPARAMETERS"])["lora"]["rank"] == 32
    assert not any("TOKEN" in key for key in settings)


def test_open_weights_preset_fills_image_placeholders_and_packs_replicas() -> None:
    objects = render(request("rft_multiturn_lora", model="qwen3-8b"))
    generation, job = of_kind(objects, "Deployment"), objects[-1]
    (vllm,) = generation["spec"]["template"]["spec"]["containers"]
    assert vllm["image"] == "vllm/vllm-openai:v0.11.0"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "1"
    trainer = job["spec"]["replicaSpecs"][0]
    assert trainer["template"]["spec"]["containers"][0]["image"] == (
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/nova-mtrl-grpo-trainer:latest"
    )
    # Two 1-GPU vLLM replicas share one node: three of the four nodes train.
    assert trainer["replicas"] == 3


def test_lora_flags_only_for_lora() -> None:
    lora, full = (
        of_kind(render(request(config)), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        for config in ("rft_multiturn_lora", "rft_multiturn_full")
    )
    assert "--enable-lora" in lora["args"] and "--enable-lora" not in full["args"]


def test_too_few_nodes_for_generation_and_trainer_is_a_clear_error() -> None:
    with pytest.raises(
        JobRenderError, match="instance_count 1 leaves no node for the trainer.*at least 2"
    ):
        render(request("rft_multiturn_lora", instance_count=1))


def test_unknown_instance_type_and_oversized_replica_are_clear_errors() -> None:
    with pytest.raises(JobRenderError, match="ml.c5.xlarge is not a GPU type"):
        node_split(
            request("rft_multiturn_lora", instance_type="ml.c5.xlarge").config,
            PRESETS["qwen3-8b"],
        )
    small = request("rft_multiturn_lora", instance_type="ml.g5.12xlarge")
    eight = ModelPreset.model_validate({**PRESETS["qwen3-8b"].model_dump(), "generation_gpus": 8})
    with pytest.raises(JobRenderError, match="needs 8 GPUs but ml.g5.12xlarge has 4"):
        node_split(small.config, eight)


def test_namespace_fits_kubernetes_and_stays_distinct() -> None:
    long_a, long_b = "a" * 40 + "-0123456789", "a" * 40 + "-9876543210"
    names = {run_namespace("a-long-deployment-nm", run) for run in (long_a, long_b)}
    assert len(names) == 2
    assert all(len(name) <= 63 and name.startswith("a-long-deployment-nm-run-") for name in names)


def test_preset_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="tensor_parallel"):
        ModelPreset.model_validate({**PRESETS["qwen3-8b"].model_dump(), "tensor_parallel": 2})
