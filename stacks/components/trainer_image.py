"""The open-weights trainer's image (llm_trainer/Dockerfile), built by `cdk deploy` like the
reward worker's and pushed to the CDK assets repository; presets without a `trainer_image` of
their own run it."""

from __future__ import annotations

from constructs import Construct

from stacks.components.project_files import project_image

TRAINER_DOCKERFILE = "llm_trainer/Dockerfile"
# The image's build context: what llm_trainer/Dockerfile copies and nothing else.
BUILD_CONTEXT = ("domain", "training_configs", "llm_trainer")


class TrainerImage(Construct):
    """Attributes: `image_uri` (what a preset's pods run), `repository_arn` (what the GPU nodes
    pull from)."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        asset = project_image(self, "Image", dockerfile=TRAINER_DOCKERFILE, folders=BUILD_CONTEXT)
        self.image_uri = asset.image_uri
        self.repository_arn = asset.repository.repository_arn
