"""What a deployment runs a model with: its presets (deployment configuration, cdk.json
`model_presets`), the kind of training job, and whether a training config fits them (the GPU
types the open-weights trainer knows, one node)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from training_configs.schema import TrainingConfig

JobKind = Literal["HyperPodPyTorchJob", "PyTorchJob"]
# A secret's name: ASCII letters, digits and /_+=.@- (botocore's Secrets Manager model,
# CreateSecret `Name`).
SECRET_NAME = r"^[A-Za-z0-9/_+=.@-]+$"


class ModelPreset(BaseModel):
    """An open-weights model the deployment trains with its trainer image (llm_trainer/): the
    weights the trainer loads and the image it runs in. The image URI may use `{account}`,
    `{region}` and `{prefix}`, filled in for the deployment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_id: str = Field(
        min_length=1,
        description="where the weights come from: a Hugging Face Hub id, s3://bucket/prefix/ or "
        "a path in the image",
    )
    hub_token_secret: str | None = Field(
        default=None,
        max_length=512,
        pattern=SECRET_NAME,
        description="for a gated Hugging Face model: the name of the Secrets Manager secret (in "
        "the deployment's account and region) whose value is a Hugging Face access token",
    )
    trainer_image: str | None = Field(
        default=None,
        min_length=1,
        description="the image the trainer runs in; unset: the one `cdk deploy` builds from "
        "llm_trainer/Dockerfile",
    )


class PresetMismatch(ValueError):
    """A training config and the deployment's presets do not make an open-weights job (the
    message says what to change)."""


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


def preset_for(config: TrainingConfig, presets: dict[str, ModelPreset]) -> ModelPreset:
    """The config's model preset, checked to fit the trainer (PresetMismatch says what to change)."""
    preset = presets.get(config.model)
    if preset is None:
        known = ", ".join(sorted(presets)) or "none"
        raise PresetMismatch(
            f"training config model {config.model!r} has no preset in this deployment "
            f"(model_presets: {known}); use one of those or add a preset to cdk.json"
        )
    check_fits(config)
    return preset


def check_fits(config: TrainingConfig) -> None:
    """The config's nodes are what the open-weights trainer runs on: one GPU node."""
    accelerators(config.instance_type)
    if config.instance_count != 1:
        raise PresetMismatch(
            f"instance_count {config.instance_count}: the open-weights trainer runs on one node "
            f"(generation and updates in one process); set instance_count: 1"
        )


def accelerators(instance_type: str) -> tuple[int, int]:
    try:
        return ACCELERATORS[instance_type]
    except KeyError:
        known = ", ".join(sorted(ACCELERATORS))
        raise PresetMismatch(
            f"instance_type {instance_type} is not a GPU type the job renderer knows ({known})"
        ) from None
