"""A run's training job as Kubernetes objects (data, no client): what `submit` applies.

Per run, in a namespace of its own (`<prefix>-run-<run id>`):
- `ServiceAccount/run-workloads`: the pods' AWS identity (an EKS Pod Identity association to
  the deployment's training-job role, made by the backend: queues, dataset, outputs);
- `ConfigMap/run-settings`: the run configuration — `MTRL_TRAINING_JOB`, the JSON the trainer
  reads (domain/trainer_job.py `TrainingJob`: run, dataset, outputs, queues, training config,
  base checkpoint, and the preset's `model_id` as where the weights come from) — and the region;
- the open-weights trainer (`llm_trainer` in the preset's image, a process per GPU under
  torchrun): generation and updates on one node, as a `HyperPodPyTorchJob` (HyperPod's training operator,
  whose job auto-resume restarts it; it resumes from its last checkpoint) or, when configured, a
  Kubeflow `PyTorchJob`.

The image and the model come from a `ModelPreset` (deployment configuration), chosen by the
training config's `model`. Every object carries the run's labels: teardown finds them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.episodes import EvaluationStage
from domain.naming import RUN_SERVICE_ACCOUNT, run_namespace
from domain.presets import JobKind, ModelPreset, PresetMismatch, accelerators, check_fits
from domain.trainer_job import JOB_VARIABLE, TrainingJob
from training_configs.schema import TrainingConfig

JOB_API = {"HyperPodPyTorchJob": "sagemaker.amazonaws.com/v1", "PyTorchJob": "kubeflow.org/v1"}
JOB_NAME = "trainer"
SETTINGS = "run-settings"
# One trainer process per GPU of the node (torchrun: "gpu" = as many as it sees); each generates
# and trains, the first plays the steps (llm_trainer/distributed.py).
TRAINER_COMMAND = [
    "python", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=gpu",
    "-m", "llm_trainer",
]  # fmt: skip
# The workloads' identity: EKS Pod Identity maps it to the deployment's training-job IAM role.
RUN_LABEL = "nova-mtrl/run"
SCRATCH = "/scratch"
RESTARTS = 3  # of a failed trainer, each resuming from the last checkpoint
DEPLOYMENT_LABEL = "nova-mtrl/deployment"
COMPONENT_LABEL = "app.kubernetes.io/component"


@dataclass(frozen=True)
class JobRequest:
    """Everything the objects of one run depend on: the trainer's job (its config included),
    the deployment's preset for the config's model, and where the deployment is."""

    job: TrainingJob
    prefix: str
    preset: ModelPreset
    account: str
    region: str
    kind: JobKind = "HyperPodPyTorchJob"

    @property
    def run_id(self) -> str:
        return self.job.run_id

    @property
    def config(self) -> TrainingConfig:
        return self.job.config


def run_labels(prefix: str, run_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/managed-by": "nova-mtrl",
        DEPLOYMENT_LABEL: prefix,
        RUN_LABEL: run_id,
    }


def job_name(stage: EvaluationStage | None = None) -> str:
    """The run's training job, or the job that evaluates `stage`."""
    return JOB_NAME if stage is None else f"evaluation-{stage}"


def settings_name(stage: EvaluationStage | None = None) -> str:
    return SETTINGS if stage is None else f"{job_name(stage)}-settings"


def render(request: JobRequest, *, stage: EvaluationStage | None = None) -> list[dict[str, Any]]:
    """The run's objects, in the order they must be applied (namespace first): its training
    job, or with `stage` the job that evaluates the starting (baseline) or trained (final)
    model on the held-out records — the same program, told so by its run configuration."""
    check_fits(request.config)
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
            "metadata": _metadata(RUN_SERVICE_ACCOUNT, namespace, labels),
            # The pods reach AWS through Pod Identity, never the Kubernetes API.
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _metadata(settings_name(stage), namespace, labels),
            "data": run_settings(request, stage=stage),
        },
        _trainer_job(request, namespace, labels, stage),
    ]


def trainer_job(request: JobRequest, *, stage: EvaluationStage | None = None) -> TrainingJob:
    """The run configuration the trainer reads: the run's job (or its evaluation of `stage`),
    the weights (and the secret of a gated model's Hub token) from the preset."""
    preset = request.preset
    return request.job.model_copy(
        update={
            "model_source": preset.model_id,
            "hub_token_secret": preset.hub_token_secret,
            "evaluation": stage,
        }
    )


def run_settings(request: JobRequest, *, stage: EvaluationStage | None = None) -> dict[str, str]:
    """The trainer's environment (no secrets: those never go in a ConfigMap)."""
    return {
        JOB_VARIABLE: trainer_job(request, stage=stage).model_dump_json(),
        "AWS_REGION": request.region,
        # What botocore reads the region from (it does not read AWS_REGION): the trainer's boto3.
        "AWS_DEFAULT_REGION": request.region,
        # Downloads, checkpoints on their way and compiled kernels go to the scratch volume.
        "TMPDIR": SCRATCH,
        "HF_HOME": f"{SCRATCH}/huggingface",
        "TRITON_CACHE_DIR": f"{SCRATCH}/triton",
    }


def _metadata(name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels}


def _image(template: str | None, request: JobRequest) -> str:
    if template is None:
        raise PresetMismatch(
            f"model preset {request.config.model!r} has no trainer image: the deployment's "
            "presets name the one `cdk deploy` built; redeploy (cdk deploy) or set trainer_image"
        )
    return template.format(account=request.account, region=request.region, prefix=request.prefix)


def _pod_spec(request: JobRequest, container: dict[str, Any], settings: str) -> dict[str, Any]:
    return {
        "serviceAccountName": RUN_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "nodeSelector": {"node.kubernetes.io/instance-type": request.config.instance_type},
        "containers": [
            {
                **container,
                "envFrom": [{"configMapRef": {"name": settings}}],
                "volumeMounts": [
                    {"name": "scratch", "mountPath": SCRATCH},
                    {"name": "shared-memory", "mountPath": "/dev/shm"},
                ],
            },
        ],
        "volumes": [
            {"name": "scratch", "emptyDir": {}},
            # PyTorch's data loaders and NCCL need more shared memory than a container's 64 MiB.
            {"name": "shared-memory", "emptyDir": {"medium": "Memory"}},
        ],
    }


def _trainer_job(
    request: JobRequest, namespace: str, labels: dict[str, str], stage: EvaluationStage | None
) -> dict[str, Any]:
    gpus, _ = accelerators(request.config.instance_type)
    name = job_name(stage)
    pod_labels = {**labels, COMPONENT_LABEL: name}
    resources = {"nvidia.com/gpu": str(gpus)}
    container = {
        # Kubeflow's operator finds the training container by this name.
        "name": "pytorch",
        "image": _image(request.preset.trainer_image, request),
        "command": TRAINER_COMMAND,
        "resources": {"limits": resources, "requests": resources},
    }
    template = {
        "metadata": {"labels": pod_labels},
        "spec": _pod_spec(request, container, settings_name(stage)),
    }
    deadline = int(request.config.deadline_hours * 3600)
    if request.kind == "HyperPodPyTorchJob":
        spec: dict[str, Any] = {
            "nprocPerNode": "1",  # one launcher (torchrun), which starts a process per GPU
            "replicaSpecs": [{"name": name, "replicas": 1, "template": template}],
            "runPolicy": {
                "activeDeadlineSeconds": deadline,
                "cleanPodPolicy": "None",  # keep failed pods for their logs until teardown
                # A restarted trainer resumes from its last checkpoint (llm_trainer/trainer.py).
                "jobMaxRetryCount": RESTARTS,
                "ttlSecondsAfterFinished": -1,  # teardown deletes the job, not a timer
            },
        }
    else:
        spec = {
            "nprocPerNode": "1",
            "pytorchReplicaSpecs": {
                "Master": {"restartPolicy": "Never", "template": template, "replicas": 1}
            },
            "runPolicy": {
                "activeDeadlineSeconds": deadline,
                "backoffLimit": RESTARTS,
                "cleanPodPolicy": "None",
            },
        }
    return {
        "apiVersion": JOB_API[request.kind],
        "kind": request.kind,
        "metadata": _metadata(name, namespace, pod_labels),
        "spec": spec,
    }
