"""The training-job renderer: golden objects for the shipped LoRA and FULL configs, schema
validation (Kubernetes' own schemas for the built-in kinds, HyperPod's CRD model for its job),
and the errors a user sees when a config and the deployment's presets do not fit."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from botocore.configprovider import BOTOCORE_DEFAUT_SESSION_VARIABLES

from domain.naming import run_namespace
from domain.presets import ModelPreset, PresetMismatch, preset_for
from domain.trainer_job import TrainingJob, job_from_environment
from lambdas.kubernetes.training_job import RESTARTS, RUN_LABEL, JobRequest, render
from stacks.components.project_files import PROJECT_ROOT
from stacks.config import PlatformConfig, deployment_context
from training_configs.schema import load_training_config

GOLDEN = Path(__file__).parent / "golden"
KUBERNETES_VERSION = "1.33"
PRESETS = PlatformConfig.from_context(deployment_context()).model_presets
QUEUES = {
    name: f"https://sqs.us-east-1.amazonaws.com/123456789012/nova-mtrl-wordle-0a1b2c3d4e-{name}.fifo"
    for name in ("rollout_requests", "rollout_responses", "generate_requests", "generate_responses", "dlq")
}  # fmt: skip


IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/cdk-assets:trainer"


def request(config: str, *, model: str = "qwen3-8b", **changes: Any) -> JobRequest:
    training = load_training_config(config)
    training = training.model_copy(update={"model": model, "instance_count": 1, **changes})
    job = TrainingJob(
        run_id="wordle-0a1b2c3d4e",
        bucket="nova-mtrl-data-123456789012",
        dataset_key="training-data/wordle.jsonl",
        output_prefix="runs/wordle-0a1b2c3d4e/",
        queues=QUEUES,
        config=training,
    )
    # The pipeline's presets name the image `cdk deploy` built (stacks/components/training_control.py).
    preset = PRESETS[model].model_copy(update={"trainer_image": IMAGE})
    return JobRequest(job=job, prefix="nova-mtrl", preset=preset, account="123456789012",
                      region="us-east-1")  # fmt: skip


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


def test_kubeflow_fallback_validates_with_one_master() -> None:
    from dataclasses import replace

    objects = render(replace(request("rft_multiturn_full"), kind="PyTorchJob"))
    job = objects[-1]
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    assert job["spec"]["runPolicy"]["backoffLimit"] == RESTARTS
    for obj in objects:
        validate(obj)


def test_schema_validation_catches_a_misspelt_field() -> None:
    job = render(request("rft_multiturn_lora"))[-1]
    job["spec"]["runPolicy"]["jobMaxRetries"] = 0
    with pytest.raises(ValueError, match="jobMaxRetries"):
        validate(job)
    settings = of_kind(render(request("rft_multiturn_lora")), "ConfigMap")
    settings["dataa"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(settings)


def test_every_object_is_labelled_with_the_run_and_lives_in_its_namespace() -> None:
    objects = render(request("rft_multiturn_lora"))
    namespace = run_namespace("nova-mtrl", "wordle-0a1b2c3d4e")
    assert [obj["kind"] for obj in objects] == [
        "Namespace", "ServiceAccount", "ConfigMap", "HyperPodPyTorchJob",
    ]  # fmt: skip
    for obj in objects:
        assert obj["metadata"]["labels"][RUN_LABEL] == "wordle-0a1b2c3d4e"
        assert obj["metadata"].get("namespace", obj["metadata"]["name"]) == namespace


def test_the_settings_are_the_run_configuration_the_trainer_reads() -> None:
    settings = of_kind(render(request("rft_multiturn_lora")), "ConfigMap")["data"]
    # What `python -m llm_trainer` reads, as it reads it (domain/trainer_job.py).
    job = job_from_environment(settings)
    assert job.queues == QUEUES and job.run_id == "wordle-0a1b2c3d4e"
    assert (job.bucket, job.dataset_key) == (
        "nova-mtrl-data-123456789012",
        "training-data/wordle.jsonl",
    )
    assert job.config.lora is not None and job.config.lora.rank == 32
    assert job.model_source == "Qwen/Qwen3-8B"  # the preset's weights
    # The trainer's boto3 finds the region where botocore looks (its session variables).
    region = BOTOCORE_DEFAUT_SESSION_VARIABLES["region"][1]
    assert settings[region] == settings["AWS_REGION"] == "us-east-1"
    assert not any("TOKEN" in key or "SECRET" in key for key in settings)


def test_a_gated_models_preset_hands_the_trainer_its_token_secret_by_name_only() -> None:
    gated = request("rft_multiturn_lora")
    gated = replace(
        gated, preset=gated.preset.model_copy(update={"hub_token_secret": "teams/ml/hf-token"})
    )
    settings = of_kind(render(gated), "ConfigMap")["data"]
    assert job_from_environment(settings).hub_token_secret == "teams/ml/hf-token"
    plain = of_kind(render(request("rft_multiturn_lora")), "ConfigMap")["data"]
    assert job_from_environment(plain).hub_token_secret is None


def test_the_trainer_runs_the_open_weights_trainer_on_one_whole_node() -> None:
    job = render(request("rft_multiturn_lora"))[-1]
    (replica,) = job["spec"]["replicaSpecs"]
    (container,) = replica["template"]["spec"]["containers"]
    assert replica["replicas"] == 1 and job["spec"]["nprocPerNode"] == "1"
    assert container["image"] == IMAGE
    # torchrun, alone in the pod, starts a trainer process per GPU it sees.
    assert container["command"] == [
        "python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=gpu",
        "-m", "llm_trainer",
    ]  # fmt: skip
    from torch.distributed.run import get_args_parser  # torchrun's own reading of them

    launch = get_args_parser().parse_args(container["command"][3:])
    assert launch.standalone and launch.nproc_per_node == "gpu"
    assert launch.module and launch.training_script == "llm_trainer"
    assert (PROJECT_ROOT / "llm_trainer" / "__main__.py").is_file()
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}  # ml.p5.48xlarge
    # Restarts resume from the last checkpoint: HyperPod's auto-resume may retry.
    assert job["spec"]["runPolicy"]["jobMaxRetryCount"] == RESTARTS > 0
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert {"/dev/shm", "/scratch"} <= mounts


def test_more_than_one_node_or_a_preset_without_image_is_a_clear_error() -> None:
    with pytest.raises(
        PresetMismatch, match="instance_count 4: the open-weights trainer runs on one node"
    ):
        render(request("rft_multiturn_lora", instance_count=4))
    with pytest.raises(PresetMismatch, match="ml.c5.xlarge is not a GPU type"):
        preset_for(request("rft_multiturn_lora", instance_type="ml.c5.xlarge").config, PRESETS)
    unbuilt = replace(request("rft_multiturn_lora"), preset=PRESETS["qwen3-8b"])
    with pytest.raises(PresetMismatch, match="no trainer image"):
        render(unbuilt)


def test_namespace_fits_kubernetes_and_stays_distinct() -> None:
    long_a, long_b = "a" * 40 + "-0123456789", "a" * 40 + "-9876543210"
    names = {run_namespace("a-long-deployment-nm", run) for run in (long_a, long_b)}
    assert len(names) == 2
    assert all(len(name) <= 63 and name.startswith("a-long-deployment-nm-run-") for name in names)


def test_preset_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="generation_image"):
        ModelPreset.model_validate({**PRESETS["qwen3-8b"].model_dump(), "generation_image": "v"})
