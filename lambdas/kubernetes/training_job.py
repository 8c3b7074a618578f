"""A run's training job as Kubernetes objects (data, no client): what `submit` applies.

Per run, in a namespace of its own (`<prefix>-run-<run id>`):
- `ServiceAccount/run-workloads`: the pods' AWS identity (an EKS Pod Identity association to
  the deployment's training-job role, made by the backend: queues, dataset, outputs);
- `ConfigMap/run-settings`: the run's queues, model, recipe and hyperparameters, the output
  and dataset S3 locations — read by both workloads as environment;
- `Deployment/generation` + `Service/generation`: the vLLM server, one replica per
  `generation_replicas`, each with the preset's `generation_gpus` GPUs;
- the GRPO trainer on the nodes left over: a `HyperPodPyTorchJob` (HyperPod's training
  operator, with its job auto-resume) or, when configured, a Kubeflow `PyTorchJob`.

Images, recipe and model ids come from a `ModelPreset` (deployment configuration), chosen by
the training config's `model`. Every object carries the run's labels: teardown finds them all.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from domain.presets import JobKind, ModelPreset
from training_configs.schema import TrainingConfig

JOB_API = {"HyperPodPyTorchJob": "sagemaker.amazonaws.com/v1", "PyTorchJob": "kubeflow.org/v1"}
JOB_NAME = "trainer"
GENERATION = "generation"
SETTINGS = "run-settings"
# The workloads' identity: EKS Pod Identity maps it to the deployment's training-job IAM role.
SERVICE_ACCOUNT = "run-workloads"
GENERATION_PORT = 8000
RUN_LABEL = "nova-mtrl/run"
DEPLOYMENT_LABEL = "nova-mtrl/deployment"
COMPONENT_LABEL = "app.kubernetes.io/component"
_NAMESPACE_LIMIT = 63

# GPUs and EFA interfaces per HyperPod instance type (the AWS instance specifications).
ACCELERATORS: dict[str, tuple[int, int]] = {
    "ml.p5.48xlarge": (8, 32),
    "ml.p5e.48xlarge": (8, 32),
    "ml.p5en.48xlarge": (8, 16),
    "ml.p4d.24xlarge": (8, 4),
    "ml.p4de.24xlarge": (8, 4),
    "ml.g5.48xlarge": (8, 1),
    "ml.g5.12xlarge": (4, 1),
    "ml.g6.48xlarge": (8, 1),
    "ml.g6.12xlarge": (4, 1),
}


class JobRenderError(ValueError):
    """The training config and the deployment's presets do not make a job (the message says why)."""


@dataclass(frozen=True)
class JobRequest:
    """Everything the objects of one run depend on."""

    run_id: str
    prefix: str
    config: TrainingConfig
    preset: ModelPreset
    queues: dict[str, str]
    output_uri: str
    dataset_uri: str
    account: str
    region: str
    kind: JobKind = "HyperPodPyTorchJob"


def run_namespace(prefix: str, run_id: str) -> str:
    """`<prefix>-run-<run id>`, shortened with a hash to Kubernetes' 63 characters."""
    name = re.sub(r"[^a-z0-9-]", "-", f"{namespace_prefix(prefix)}{run_id}".lower()).strip("-")
    if len(name) <= _NAMESPACE_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: _NAMESPACE_LIMIT - 11].rstrip('-')}-{digest}"


def namespace_prefix(prefix: str) -> str:
    """What every run namespace of the deployment starts with (access is scoped to it)."""
    return f"{prefix}-run-"


def run_labels(prefix: str, run_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "nova-mtrl",
        DEPLOYMENT_LABEL: prefix,
        RUN_LABEL: run_id,
    }


def preset_for(config: TrainingConfig, presets: dict[str, ModelPreset]) -> ModelPreset:
    """The config's model preset, checked to fit its nodes (JobRenderError says what to change)."""
    preset = presets.get(config.model)
    if preset is None:
        known = ", ".join(sorted(presets)) or "none"
        raise JobRenderError(
            f"training config model {config.model!r} has no preset in this deployment "
            f"(model_presets: {known}); use one of those or add a preset to cdk.json"
        )
    node_split(config, preset)
    return preset


def node_split(config: TrainingConfig, preset: ModelPreset) -> tuple[int, int]:
    """(nodes for generation, nodes for the trainer) out of the config's `instance_count`."""
    gpus_per_node, _ = accelerators(config.instance_type)
    if preset.generation_gpus > gpus_per_node:
        raise JobRenderError(
            f"a vLLM replica needs {preset.generation_gpus} GPUs but {config.instance_type} has "
            f"{gpus_per_node}: lower the preset's generation_gpus or pick a larger instance type"
        )
    per_node = gpus_per_node // preset.generation_gpus
    generation_nodes = math.ceil(config.generation_replicas / per_node)
    trainer_nodes = config.instance_count - generation_nodes
    if trainer_nodes < 1:
        raise JobRenderError(
            f"instance_count {config.instance_count} leaves no node for the trainer: "
            f"{config.generation_replicas} vLLM replicas of {preset.generation_gpus} GPUs take "
            f"{generation_nodes} {config.instance_type} node(s); set instance_count to at least "
            f"{generation_nodes + 1}"
        )
    return generation_nodes, trainer_nodes


def accelerators(instance_type: str) -> tuple[int, int]:
    try:
        return ACCELERATORS[instance_type]
    except KeyError:
        known = ", ".join(sorted(ACCELERATORS))
        raise JobRenderError(
            f"instance_type {instance_type} is not a GPU type the job renderer knows ({known})"
        ) from None


def render(request: JobRequest) -> list[dict[str, Any]]:
    """The run's objects, in the order they must be applied (namespace first)."""
    _, trainer_nodes = node_split(request.config, request.preset)
    namespace = run_namespace(request.prefix, request.run_id)
    labels = run_labels(request.prefix, request.run_id)
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": labels},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(SERVICE_ACCOUNT, namespace, labels),
            # The pods reach AWS through Pod Identity, never the Kubernetes API.
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(SETTINGS, namespace, labels),
            "data": run_settings(request, namespace),
        },
        _generation_deployment(request, namespace, labels),
        _generation_service(namespace, labels),
        _trainer_job(request, namespace, labels, trainer_nodes),
    ]


def run_settings(request: JobRequest, namespace: str) -> dict[str, str]:
    """The environment both workloads read (no secrets: those never go in a ConfigMap)."""
    config, preset = request.config, request.preset
    queues = {f"MTRL_QUEUE_{name.upper()}": url for name, url in sorted(request.queues.items())}
    hyperparameters = config.model_dump(
        mode="json",
        include={
            "group_size", "global_batch_size", "max_steps", "learning_rate", "kl_coefficient",
            "clip_ratio", "max_new_tokens", "max_length", "max_turns", "lora",
        },
    )  # fmt: skip
    return {
        "MTRL_RUN_ID": request.run_id,
        "MTRL_MODEL": preset.model_id,
        "MTRL_RECIPE": preset.recipes[config.recipe],
        "MTRL_HYPERPARAMETERS": json.dumps(hyperparameters, sort_keys=True),
        "MTRL_OUTPUT_URI": request.output_uri,
        "MTRL_DATASET_URI": request.dataset_uri,
        "MTRL_GENERATION_URL": f"http://{GENERATION}.{namespace}.svc:{GENERATION_PORT}/v1",
        "AWS_REGION": request.region,
        **queues,
    }


def _metadata(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels}


def _image(template: str, request: JobRequest) -> str:
    return template.format(account=request.account, region=request.region, prefix=request.prefix)


def _pod_spec(request: JobRequest, container: dict[str, Any]) -> dict[str, Any]:
    return {
        "serviceAccountName": SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "nodeSelector": {"node.kubernetes.io/instance-type": request.config.instance_type},
        "containers": [
            {**container, "envFrom": [{"configMapRef": {"name": SETTINGS}}]},
        ],
    }


def _generation_deployment(
    request: JobRequest, namespace: str, labels: dict[str, str]
) -> dict[str, Any]:
    config, preset = request.config, request.preset
    pod_labels = {**labels, COMPONENT_LABEL: GENERATION}
    gpus = str(preset.generation_gpus)
    container = {
        "name": "vllm",
        "image": _image(preset.generation_image, request),
        "args": [
            "--model",
            preset.generation_model or preset.model_id,
            "--port",
            str(GENERATION_PORT),
            "--tensor-parallel-size",
            gpus,
            "--max-model-len",
            str(config.max_length),
            *(["--enable-lora", "--max-lora-rank", str(config.lora.rank)] if config.lora else []),
        ],  # fmt: skip
        "ports": [{"name": "http", "containerPort": GENERATION_PORT}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": GENERATION_PORT},
            "periodSeconds": 10,
        },
        "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"nvidia.com/gpu": gpus}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(GENERATION, namespace, pod_labels),
        "spec": {
            "replicas": config.generation_replicas,
            "selector": {"matchLabels": {RUN_LABEL: request.run_id, COMPONENT_LABEL: GENERATION}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": _pod_spec(request, container),
            },
        },
    }


def _generation_service(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(GENERATION, namespace, {**labels, COMPONENT_LABEL: GENERATION}),
        "spec": {
            "selector": {RUN_LABEL: labels[RUN_LABEL], COMPONENT_LABEL: GENERATION},
            "ports": [{"name": "http", "port": GENERATION_PORT, "targetPort": "http"}],
        },
    }


def _trainer_job(
    request: JobRequest, namespace: str, labels: dict[str, str], nodes: int
) -> dict[str, Any]:
    gpus, efa = accelerators(request.config.instance_type)
    pod_labels = {**labels, COMPONENT_LABEL: JOB_NAME}
    resources = {"nvidia.com/gpu": str(gpus), "vpc.amazonaws.com/efa": str(efa)}
    container = {
        # Kubeflow's operator finds the training container by this name.
        "name": "pytorch",
        "image": _image(request.preset.trainer_image, request),
        "resources": {"limits": resources, "requests": resources},
    }
    template = {"metadata": {"labels": pod_labels}, "spec": _pod_spec(request, container)}
    deadline = int(request.config.deadline_hours * 3600)
    if request.kind == "HyperPodPyTorchJob":
        spec: dict[str, Any] = {
            "nprocPerNode": str(gpus),
            "replicaSpecs": [{"name": JOB_NAME, "replicas": nodes, "template": template}],
            "runPolicy": {
                "activeDeadlineSeconds": deadline,
                "cleanPodPolicy": "None",  # keep failed pods for their logs until teardown
                "jobMaxRetryCount": 0,
                "ttlSecondsAfterFinished": -1,  # teardown deletes the job, not a timer
            },
        }
    else:
        replica = {"restartPolicy": "Never", "template": template}
        workers = {"Worker": {**replica, "replicas": nodes - 1}} if nodes > 1 else {}
        spec = {
            "nprocPerNode": str(gpus),
            "pytorchReplicaSpecs": {"Master": {**replica, "replicas": 1}, **workers},
            "runPolicy": {
                "activeDeadlineSeconds": deadline,
                "backoffLimit": 0,
                "cleanPodPolicy": "None",
            },
        }
    return {
        "apiVersion": JOB_API[request.kind],
        "kind": request.kind,
        "metadata": _metadata(JOB_NAME, namespace, pod_labels),
        "spec": spec,
    }
