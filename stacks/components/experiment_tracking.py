"""The deployment's optional SageMaker managed MLflow tracking server (config
`mlflow_server_size`; off by default: it bills by the hour while it exists).

With it, NotifyEnd logs every run there (lambdas/pipeline/experiment_tracking.py) and Nova's
recipes are given its ARN as their `mlflow_tracking_uri` where they have the key, so AWS's
trainer logs there too. The server keeps its artifacts under `mlflow/` in the data bucket, with
a role SageMaker assumes for that prefix alone (AWS's guide names AmazonS3FullAccess for it;
this narrower grant is unverified until a deployment runs it, docs/users/tracking.md).
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from domain.bucket import RUNS_PREFIX
from domain.needs import Need
from stacks.components.storage import DataBucketAccess

ARTIFACTS_PREFIX = "mlflow/"
SERVER_SETTING = "MLFLOW_TRACKING_SERVER_ARN"
# What logging a run takes (lambdas/pipeline/experiment_tracking.py), as IAM actions of the
# Service Authorization Reference's "Amazon SageMaker with MLflow".
LOG_ACTIONS = (
    "sagemaker-mlflow:GetExperimentByName",
    "sagemaker-mlflow:CreateExperiment",
    "sagemaker-mlflow:CreateRun",
    "sagemaker-mlflow:LogBatch",
    "sagemaker-mlflow:UpdateRun",
)


class ExperimentTracking(Construct):
    """Attributes: `server_arn` (None without a server), `environment` (what the functions that
    log are told)."""

    provides = frozenset({Need.EXPERIMENTS_LOG})

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name_prefix: str,
        server_size: str | None,
        data_bucket: s3.IBucket,
        data_key: kms.IKey,
    ) -> None:
        """`server_size`: the managed MLflow tracking server's (none: no server)."""
        super().__init__(scope, construct_id)
        self._access = DataBucketAccess(data_bucket, data_key)
        self.server_arn: str | None = None
        self.environment: dict[str, str] = {}
        if server_size is None:
            return
        name = name_prefix
        role = iam.Role(
            self,
            "ServerRole",
            assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"),
            description="SageMaker's MLflow tracking server keeps its artifacts in the data bucket",
        )
        self._access.grant_objects(
            role, ARTIFACTS_PREFIX, "s3:GetObject", "s3:PutObject", "s3:DeleteObject"
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket", "s3:GetBucketLocation"],
                resources=[data_bucket.bucket_arn],
            )
        )
        for action in ("kms:GenerateDataKey", "kms:Decrypt"):
            self._access.grant_key(role, action)
        server = sagemaker.CfnMlflowTrackingServer(
            self,
            "Server",
            tracking_server_name=name,
            artifact_store_uri=f"s3://{data_bucket.bucket_name}/{ARTIFACTS_PREFIX}",
            role_arn=role.role_arn,
            tracking_server_size=server_size,
            automatic_model_registration=False,  # Collect registers the runs' models itself
        )
        server.node.add_dependency(role)
        self.server_arn = Stack.of(self).format_arn(
            service="sagemaker", resource="mlflow-tracking-server", resource_name=name
        )
        self.environment = {SERVER_SETTING: self.server_arn}

    def grant(self, need: Need, role: iam.IRole) -> None:
        """Logging runs: the server's calls a tracker makes, the run outputs it reads, its files
        into the artifact store. Nothing without a server."""
        if need is not Need.EXPERIMENTS_LOG or self.server_arn is None:
            return
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=list(LOG_ACTIONS), resources=[self.server_arn])
        )
        access = self._access
        access.grant_objects(role, RUNS_PREFIX, "s3:GetObject")
        access.grant_list(role, RUNS_PREFIX)  # whether a run's summary and evaluation are there
        access.grant_objects(role, ARTIFACTS_PREFIX, "s3:PutObject")
        for action in ("kms:Decrypt", "kms:GenerateDataKey"):
            access.grant_key(role, action)
