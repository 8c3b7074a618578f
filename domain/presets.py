"""What a deployment runs a model with: its presets (deployment configuration, cdk.json
`model_presets`) and the kind of training job."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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
