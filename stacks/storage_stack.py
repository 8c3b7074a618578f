"""Phase 1: the buckets and the data key."""

from __future__ import annotations

import aws_cdk as cdk
from constructs import Construct

from domain.bucket import TRAINING_DATA_PREFIX
from domain.naming import StackOutput
from stacks.base import PlatformStack
from stacks.components.storage import Storage
from stacks.components.trajectory_table import TrajectoryTable
from stacks.config import PlatformConfig


class StorageStack(PlatformStack):
    def __init__(self, scope: Construct, *, config: PlatformConfig) -> None:
        super().__init__(scope, "storage", config=config, description="data bucket, KMS key, logs")
        self.storage = Storage(
            self, "Storage", name_prefix=config.name_prefix,
            artifact_retention_days=config.run_artifact_retention_days,
        )  # fmt: skip
        bucket = self.storage.data_bucket.bucket_name
        cdk.CfnOutput(self, StackOutput.DATA_BUCKET_NAME, value=bucket)
        cdk.CfnOutput(
            self,
            StackOutput.UPLOAD_COMMAND,
            value=cdk.Fn.join(
                "", ["aws s3 cp data.jsonl s3://", bucket, f"/{TRAINING_DATA_PREFIX}"]
            ),
            description="Starts a training run",
        )
        trajectories = TrajectoryTable(
            self,
            "Trajectories",
            name_prefix=config.name_prefix,
            data_bucket=self.storage.data_bucket,
            data_key=self.storage.data_key,
        )
        cdk.CfnOutput(
            self,
            StackOutput.TRAJECTORY_TABLE,
            value=f"{trajectories.database_name}.{trajectories.table_name}",
            description="SQL over every run's rollouts (Athena, with WHERE run = '<run id>')",
        )
        cdk.CfnOutput(self, StackOutput.ATHENA_WORK_GROUP, value=trajectories.workgroup_name)
