"""Buckets: the data bucket (datasets, run artifacts), its access logs, HyperPod lifecycle scripts."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import ArnFormat, Aws, DefaultStackSynthesizer, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3deploy
from constructs import Construct, IConstruct

from domain.bucket import (
    CONFIGS_PREFIX,
    QUERY_RESULTS_PREFIX,
    RUNS_PREFIX,
    TRAINING_DATA_PREFIX,
    TRAJECTORIES_PREFIX,
)
from domain.checkpoints import CHECKPOINTS
from domain.needs import Need
from stacks.components.functions import (
    CUSTOM_RESOURCE,
    ENVIRONMENT_WITHOUT_SECRETS,
    NO_RESERVED_CONCURRENCY,
)
from stacks.components.nag import (
    CDK_HANDLER,
    Wildcard,
    acknowledge,
    acknowledge_managed_policy,
    acknowledge_resource,
)
from stacks.components.scan import justify
from training_configs.schema import EVALUATION_DATA_PREFIX

LIFECYCLE_SCRIPTS = Path(__file__).resolve().parent.parent / "assets" / "hyperpod_lifecycle"
LIFECYCLE_PREFIX = "hyperpod-lifecycle/"


class Storage(Construct):
    """The platform's buckets and the key that encrypts the data.

    Attributes: `data_key`, `data_bucket`, `access_log_bucket`, `lifecycle_bucket`,
    `lifecycle_deployment` (what must finish before HyperPod reads the scripts).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, name_prefix: str, artifact_retention_days: int
    ) -> None:
        """`name_prefix`: the deployment's (the buckets' and the key alias's names);
        `artifact_retention_days`: how long a run's outputs and trajectories are kept."""
        super().__init__(scope, construct_id)
        self.data_key = self._data_key(name_prefix)
        self.access_log_bucket = self._access_logs()
        self.data_bucket = self._data_bucket(name_prefix, artifact_retention_days)
        self.lifecycle_bucket, self.lifecycle_deployment = self._lifecycle_scripts(name_prefix)
        self._acknowledge_cdk_helpers()

    def _data_key(self, name_prefix: str) -> kms.Key:
        key = kms.Key(
            self,
            "DataKey",
            alias=f"alias/{name_prefix}-data",
            description="Encrypts nova-mtrl datasets, run artifacts, queues and tables",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        # The deployment's log groups are encrypted with it: CloudWatch Logs uses the key for
        # log groups of this account and region only (CloudWatch Logs User Guide, "Encrypt log
        # data in CloudWatch Logs using AWS KMS", the key policy it gives).
        stack = Stack.of(self)
        key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*",
                         "kms:Describe*"],
                resources=["*"],
                conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": stack.format_arn(
                    service="logs", resource="log-group", resource_name="*",
                    arn_format=ArnFormat.COLON_RESOURCE_NAME)}},
            )
        )  # fmt: skip
        return key

    def _access_logs(self) -> s3.Bucket:
        logs = s3.Bucket(
            self,
            "AccessLogs",
            # S3 server access logging only delivers to SSE-S3 buckets.
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[
                s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(365))
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        acknowledge(
            logs,
            "AwsSolutions-S1",
            "This is the access-log bucket itself; logging it into itself would loop.",
        )
        justify(
            logs, "CKV_AWS_18",
            "This is the access-log bucket itself; logging it into itself would loop",
        )  # fmt: skip
        justify(
            logs, "CKV_AWS_21",
            "S3's log delivery writes each access log once and never overwrites one; versions "
            "would only keep what the 365-day expiry removes",
        )  # fmt: skip
        return logs

    def _data_bucket(self, name_prefix: str, retention_days: int) -> s3.Bucket:
        bucket = s3.Bucket(
            self,
            "Data",
            bucket_name=data_bucket_name(name_prefix),
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.data_key,
            bucket_key_enabled=True,
            versioned=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            event_bridge_enabled=True,
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix="data/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-old-run-artifacts",
                    prefix=RUNS_PREFIX,
                    expiration=Duration.days(retention_days),
                ),
                s3.LifecycleRule(
                    id="expire-old-trajectories",
                    prefix=TRAJECTORIES_PREFIX,
                    expiration=Duration.days(retention_days),
                ),
                s3.LifecycleRule(
                    id="expire-query-results",
                    prefix=QUERY_RESULTS_PREFIX,
                    expiration=Duration.days(30),
                ),
                s3.LifecycleRule(
                    id="expire-replaced-versions",
                    noncurrent_version_expiration=Duration.days(30),
                ),
                s3.LifecycleRule(
                    id="abort-incomplete-uploads",
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                ),
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        return bucket

    def _lifecycle_scripts(self, name_prefix: str) -> tuple[s3.Bucket, s3deploy.BucketDeployment]:
        """HyperPod's lifecycle scripts, and the deployment that must finish before HyperPod
        reads them."""
        bucket = s3.Bucket(
            self,
            "LifecycleScripts",
            bucket_name=lifecycle_bucket_name(name_prefix),
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            minimum_tls_version=1.2,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix="lifecycle/",
            # Unversioned: the deployment below empties it on delete, so `cdk destroy` works.
            removal_policy=RemovalPolicy.DESTROY,
        )
        justify(
            bucket, "CKV_AWS_21",
            "The scripts come from the repository (their history is git's); the deployment empties "
            "the bucket on delete, which old versions would block, so `cdk destroy` completes",
        )  # fmt: skip
        deployment = s3deploy.BucketDeployment(
            self,
            "DeployLifecycleScripts",
            sources=[s3deploy.Source.asset(str(LIFECYCLE_SCRIPTS))],
            destination_bucket=bucket,
            destination_key_prefix=LIFECYCLE_PREFIX,
            retain_on_delete=False,
        )
        return bucket, deployment

    def _acknowledge_cdk_helpers(self) -> None:
        """Findings on the Lambda functions that CDK itself adds for S3 features we use."""
        stack = Stack.of(self)
        notifications = _cdk_singleton(stack, "BucketNotificationsHandler")
        deployment = _cdk_singleton(stack, "Custom::CDKBucketDeployment")
        qualifier = DefaultStackSynthesizer.DEFAULT_QUALIFIER
        asset_objects = (
            f"arn:{stack.partition}:s3:::cdk-{qualifier}-assets-{stack.account}-{stack.region}/*"
        )
        # What aws-cdk-lib gives its handlers: one reason, each finding named once.
        for handler in (notifications, deployment):
            acknowledge_managed_policy(
                handler, "service-role/AWSLambdaBasicExecutionRole", CDK_HANDLER
            )
        acknowledge(deployment, "AwsSolutions-L1", CDK_HANDLER)
        for action in (
            "s3:GetBucket*",
            "s3:GetObject*",
            "s3:List*",
            "s3:Abort*",
            "s3:DeleteObject*",
        ):
            acknowledge(deployment, f"AwsSolutions-IAM5[Action::{action}]", CDK_HANDLER)
        for objects in (asset_objects, self.lifecycle_bucket.arn_for_objects("*")):
            acknowledge_resource(deployment, objects, CDK_HANDLER)
        for handler in (notifications, deployment):
            justify(handler, "CKV_AWS_116", f"aws-cdk-lib's handler: {CUSTOM_RESOURCE}")
            justify(
                handler, "CKV_AWS_117", "aws-cdk-lib's handler calls S3's API only, at deploy "
                "time: there is nothing in the VPC for it to reach",
            )  # fmt: skip
            justify(handler, "CKV_AWS_115", NO_RESERVED_CONCURRENCY)
        justify(deployment, "CKV_AWS_173", ENVIRONMENT_WITHOUT_SECRETS)


def data_bucket_name(name_prefix: str) -> str:
    """Named from the prefix, account and region, so other stacks and the CLI can find it
    without a cross-stack reference (a retained bucket also keeps the name taken)."""
    return f"{name_prefix}-data-{Aws.ACCOUNT_ID}-{Aws.REGION}"


def lifecycle_bucket_name(name_prefix: str) -> str:
    """HyperPod's managed instance policy only reads buckets named `sagemaker-...`."""
    return f"sagemaker-{name_prefix}-lc-{Aws.ACCOUNT_ID}-{Aws.REGION}"


def lifecycle_scripts_uri(name_prefix: str) -> str:
    return f"s3://{lifecycle_bucket_name(name_prefix)}/{LIFECYCLE_PREFIX}"


def _cdk_singleton(stack: Stack, id_prefix: str) -> IConstruct:
    """A stack-level construct that aws-cdk-lib adds once per stack under a hashed id."""
    matches = [child for child in stack.node.children if child.node.id.startswith(id_prefix)]
    if len(matches) != 1:
        raise LookupError(
            f"expected one {id_prefix}* construct in {stack.stack_name}, found {len(matches)}"
        )
    return matches[0]


RUN_CHECKPOINTS = f"{RUNS_PREFIX}*/{CHECKPOINTS}"  # every run's checkpoints folder


class DataBucketAccess:
    """The needs about the data bucket's objects (stacks/components/access.py): each prefix
    with what it is read, listed or written for, and the data key as S3 uses it (SSE-KMS: an
    upload needs kms:GenerateDataKey, a download kms:Decrypt — S3 User Guide, "Using
    server-side encryption with AWS KMS keys")."""

    provides = frozenset(
        {
            Need.DATASETS_READ,
            Need.DATASETS_READ_CURRENT,
            Need.EVALUATION_DATA_READ,
            Need.CONFIGS_READ,
            Need.OUTPUTS_LIST,
            Need.OUTPUTS_READ,
            Need.OUTPUTS_WRITE,
            Need.TRAJECTORIES_WRITE,
            Need.TRAJECTORIES_READ,
            Need.CHECKPOINTS_READ,
            Need.CHECKPOINTS_PRUNE,
            Need.DATASETS_UPLOAD,
            Need.CONFIGS_UPLOAD,
        }
    )

    def __init__(self, bucket: s3.IBucket, key: kms.IKey) -> None:
        self._bucket, self._key = bucket, key

    def grant(self, need: Need, role: iam.IRole) -> None:
        match need:
            case Need.DATASETS_READ:
                # The pipeline reads a dataset at the version whose upload started the run.
                self.grant_objects(role, TRAINING_DATA_PREFIX, "s3:GetObjectVersion")
                self.grant_key(role, "kms:Decrypt")
            case Need.DATASETS_READ_CURRENT:
                self.grant_objects(role, TRAINING_DATA_PREFIX, "s3:GetObject")
                self.grant_key(role, "kms:Decrypt")
            case Need.EVALUATION_DATA_READ:
                self.grant_objects(role, EVALUATION_DATA_PREFIX, "s3:GetObject")
                self.grant_key(role, "kms:Decrypt")
            case Need.CONFIGS_READ:
                self.grant_list(role, CONFIGS_PREFIX)
                self.grant_objects(role, CONFIGS_PREFIX, "s3:GetObject")
                self.grant_key(role, "kms:Decrypt")
            case Need.OUTPUTS_LIST:
                self.grant_list(role, RUNS_PREFIX)
            case Need.OUTPUTS_READ:
                self.grant_objects(role, RUNS_PREFIX, "s3:GetObject")
                self.grant_key(role, "kms:Decrypt")
            case Need.OUTPUTS_WRITE:
                self.grant_objects(role, RUNS_PREFIX, "s3:PutObject")
                self.grant_key(role, "kms:GenerateDataKey")
            case Need.TRAJECTORIES_WRITE:  # the workers: under a prefix no other output is in
                self.grant_objects(role, TRAJECTORIES_PREFIX, "s3:PutObject")
                self.grant_key(role, "kms:GenerateDataKey")
            case Need.TRAJECTORIES_READ:
                self.grant_list(role, TRAJECTORIES_PREFIX)
                self.grant_objects(role, TRAJECTORIES_PREFIX, "s3:GetObject")
                self.grant_key(role, "kms:Decrypt")
            case Need.CHECKPOINTS_READ:  # a SageMaker endpoint's model data: one checkpoint
                self.grant_list(role, RUN_CHECKPOINTS)
                self.grant_objects(role, RUN_CHECKPOINTS, "s3:GetObject")
                self.grant_key(role, "kms:Decrypt")
            case Need.CHECKPOINTS_PRUNE:  # the trainer keeps its newest (a versioned bucket:
                # the deleted ones' versions expire as every replaced version does)
                self.grant_objects(role, RUN_CHECKPOINTS, "s3:DeleteObject")
            case Need.DATASETS_UPLOAD | Need.CONFIGS_UPLOAD:
                # A dataset's version is read back after its upload (it names the run); a large
                # file goes up in parts, which needs kms:Decrypt too (S3 User Guide, SSE-KMS).
                if need is Need.DATASETS_UPLOAD:
                    self.grant_objects(role, TRAINING_DATA_PREFIX, "s3:PutObject", "s3:GetObject")
                else:
                    self.grant_objects(role, CONFIGS_PREFIX, "s3:PutObject")
                self.grant_key(role, "kms:GenerateDataKey")
                self.grant_key(role, "kms:Decrypt")

    def grant_objects(self, role: iam.IRole, prefix: str, *actions: str) -> None:
        objects = self._bucket.arn_for_objects(f"{prefix}*")
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=list(actions), resources=[objects])
        )
        # Datasets, configs, run outputs and MLflow's files are named at run time: the prefix only.
        acknowledge_resource(role, objects, Wildcard.NAMED_AT_RUN_TIME)

    def grant_list(self, role: iam.IRole, prefix: str) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self._bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            )
        )

    def grant_key(self, role: iam.IRole, action: str) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=[action], resources=[self._key.key_arn])
        )
