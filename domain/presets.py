"""What a deployment runs a model with: its presets (deployment configuration, cdk.json
`model_presets`) and the kind of training job."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

JobKind = Literal["HyperPodPyTorchJob", "PyTorchJob"]


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
    trainer_image: str | None = Field(
        default=None,
        min_length=1,
        description="the image the trainer runs in; unset: the one `cdk deploy` builds from "
        "llm_trainer/Dockerfile",
    )
