"""Phase 1: the training pipeline's long-lived parts (so far: the rollout router)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from stacks.base import PlatformStack
from stacks.components.lambda_code import pipeline_code
from stacks.components.reward_fleet import RewardFleet
from stacks.components.router import Router
from stacks.components.storage import Storage
from stacks.config import PlatformConfig


class PipelineStack(PlatformStack):
    def __init__(
        self,
        scope: Construct,
        *,
        config: PlatformConfig,
        storage: Storage,
        reward_fleet: RewardFleet,
    ) -> None:
        super().__init__(scope, "pipeline", config=config, description="rollout router, pipeline")
        code = pipeline_code()
        self.router = Router(self, "Router", config=config, code=code, data_key=storage.data_key)
        # Reward workers call the proxy; the grant lives here so compute never depends on us.
        workers = iam.Role.from_role_arn(
            self, "RewardWorkerRole", reward_fleet.task_role.role_arn, mutable=True
        )
        self.router.grant_invoke_url(workers)
        cdk.CfnOutput(self, "RouterUrl", value=self.router.proxy_url.url)
        cdk.CfnOutput(self, "ConversationTableName", value=self.router.table.table_name)
