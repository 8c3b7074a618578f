"""What a deployment runs a model with: its presets (deployment configuration, cdk.json
`model_presets`) and the kind of training job."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from training_configs.schema import Recipe

JobKind = Literal["HyperPodPyTorchJob", "PyTorchJob"]


class ModelPreset(BaseModel):
    """Where a model's containers and recipes come from. Image URIs may use `{account}`,
    `{region}` and `{prefix}`, filled in for the deployment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_id: str = Field(min_length=1, description="the base model as the recipe names it")
    recipes: dict[Recipe, str] = Field(description="recipe id per RFT_MULTITURN_* recipe")
    trainer_image: str = Field(min_length=1)
    generation_image: str = Field(min_length=1, description="an OpenAI-compatible vLLM server")
    generation_model: str | None = Field(
        default=None, description="what vLLM loads (default: model_id)"
    )
    generation_gpus: int = Field(default=8, ge=1, le=8, description="GPUs per vLLM replica")
