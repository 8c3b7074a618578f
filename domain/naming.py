"""How a deployment names what it makes, so that IAM patterns select exactly one deployment's
run resources.

A deployment's stacks are `<prefix>-<part>`; everything made for a run at run time (its
queues and their alarms, its reward-worker service and task family, what `mtrl deploy` makes
of it on SageMaker) is named `<prefix>-run-<run id>…`, so grants over `<prefix>-run-*` reach
no resource of the platform itself (the stacks' own queues, alarms and functions are named
`<prefix>-<part>-…`). A `name_prefix` with `-run` at the end or `-run-` inside is refused:
with those out, `<prefix>-run-*` never matches a name another deployment makes under another
prefix (one that starts with ours, or one ours starts with).
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum

RUN_MARK = "run"
# The tags a run's releases carry (what `mtrl deploy` makes on Bedrock and SageMaker); the
# operator may delete only what carries its deployment's.
DEPLOYMENT_TAG = "mtrl-deployment"
RUN_TAG = "mtrl-run"
# The stacks whose outputs `mtrl` reads (the network stack has none it needs).
OUTPUT_STACKS = ("storage", "pipeline", "compute")


def stack_name(prefix: str, part: str) -> str:
    return f"{prefix}-{part}"


def run_prefix(prefix: str) -> str:
    """What the name of everything made for a run of this deployment starts with."""
    return f"{prefix}-{RUN_MARK}-"


def run_resource_name(prefix: str, run_id: str, *parts: str) -> str:
    """`<prefix>-run-<run id>[-<part>…]` with every character outside letters, digits, `_` and
    `-` replaced by `-` (a name SQS, ECS and CloudWatch all take)."""
    name = "-".join((f"{run_prefix(prefix)}{run_id}", *parts))
    return re.sub(r"[^A-Za-z0-9_-]", "-", name)


def model_group_name(prefix: str) -> str:
    """The deployment's SageMaker Model Registry group: every trained model, a version per run."""
    return f"{prefix}-models"


def checkpoint_group_name(prefix: str) -> str:
    """Where SageMaker's managed job registers a run's intermediate checkpoints (apart from the
    trained models: the job refuses the same group for both)."""
    return f"{prefix}-checkpoints"


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot name a deployment under these rules (None: it can)."""
    mark = f"-{RUN_MARK}"
    if prefix.endswith(mark) or f"{mark}-" in prefix:
        return (
            f"must not end in '{mark}' or contain '{mark}-': run resources are named "
            f"'<name_prefix>{mark}-<run id>', and grants on that pattern must not reach another "
            "deployment's"
        )
    return None


# Kubernetes' limit on a namespace's name (RFC 1123 label).
_NAMESPACE_LIMIT = 63
# The Kubernetes service account a run's pods use (its EKS Pod Identity association).
RUN_SERVICE_ACCOUNT = "run-workloads"
# The container of the deployment's reward-worker task definition.
WORKER_CONTAINER = "reward-worker"


def run_namespace(prefix: str, run_id: str) -> str:
    """A run's Kubernetes namespace, `<prefix>-run-<run id>` (so the pipeline's access, scoped
    to `run_prefix`, reaches it), shortened with a hash to Kubernetes' 63 characters."""
    name = re.sub(r"[^a-z0-9-]", "-", f"{run_prefix(prefix)}{run_id}".lower()).strip("-")
    if len(name) <= _NAMESPACE_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: _NAMESPACE_LIMIT - 11].rstrip('-')}-{digest}"


def worker_service_name(prefix: str, run_id: str) -> str:
    """The ECS service of a run's reward workers, and its task definition's family."""
    return run_resource_name(prefix, run_id, "workers")[:255]


class StackOutput(StrEnum):
    """The stacks' outputs: how `mtrl` finds a deployment's parts (mtrl/ops/deployment.py reads
    them by these names, the stacks write them)."""

    EKS_CLUSTER_NAME = "EksClusterName"
    HYPER_POD_CLUSTER_NAME = "HyperPodClusterName"
    HYPER_POD_TRAINING_GROUP_NAME = "HyperPodTrainingGroupName"
    REWARD_WORKER_CLUSTER_NAME = "RewardWorkerClusterName"
    REWARD_WORKER_TASK_FAMILY = "RewardWorkerTaskFamily"
    KUBECONFIG_COMMAND = "KubeconfigCommand"
    MLFLOW_TRACKING_SERVER_ARN = "MlflowTrackingServerArn"
    OPERATOR_POLICY_ARN = "OperatorPolicyArn"
    ROUTER_URL = "RouterUrl"
    MODEL_PACKAGE_GROUP_NAME = "ModelPackageGroupName"
    BEDROCK_IMPORT_ROLE_ARN = "BedrockImportRoleArn"
    SERVING_ROLE_ARN = "ServingRoleArn"
    CONVERSATION_TABLE_NAME = "ConversationTableName"
    STATE_MACHINE_ARN = "StateMachineArn"
    RUNS_TABLE_NAME = "RunsTableName"
    ALERT_TOPIC_ARN = "AlertTopicArn"
    PIPELINE_LOG_GROUPS = "PipelineLogGroups"
    REWARD_WORKER_LOG_GROUP_PREFIX = "RewardWorkerLogGroupPrefix"
    REAPER_FUNCTION_NAME = "ReaperFunctionName"
    DATA_BUCKET_NAME = "DataBucketName"
    UPLOAD_COMMAND = "UploadCommand"
    TRAJECTORY_TABLE = "TrajectoryTable"
    ATHENA_WORK_GROUP = "AthenaWorkGroup"
