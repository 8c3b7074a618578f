"""What each function and workload of the platform may do in AWS, declared once.

`NEEDS` names, per principal, the needs it has (`Need`); the constructs that own the resources
turn each need into the narrowest statements IAM allows (`AccessProvider.grant`). The IAM proof
(tests/iam/) checks every request the pipeline makes against what this table grants, and every
grant against the requests: a need added here and never used, or used and not here, fails it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, Protocol

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms

from stacks.components.nag import acknowledge_key_grant, acknowledge_resource


class Need(StrEnum):
    # The data bucket (datasets, configs, a run's outputs).
    DATASETS_READ = "read the dataset version a run started with"
    DATASETS_READ_CURRENT = "read datasets as they are now"
    CONFIGS_READ = "read configs"
    OUTPUTS_LIST = "list a run's outputs"
    OUTPUTS_READ = "read a run's outputs"
    OUTPUTS_WRITE = "write a run's outputs"
    # The runs table and the capacity leases in it.
    RUNS_GET = "read a run"
    RUNS_SCAN = "list the runs"
    RUNS_PUT = "store a run"
    CAPACITY_LEASES = "take and return GPU capacity leases"
    CAPACITY_LEASES_READ = "read who holds GPU capacity, since when idle"
    # The pipeline itself.
    EXECUTION_START = "start an execution"
    EXECUTIONS_STOP = "describe and stop executions"
    ALERTS_PUBLISH = "publish to the alert topic"
    # The router: conversations, run queues, their alarms, the consumer's mappings.
    CONVERSATIONS_GET = "read a conversation record"
    CONVERSATIONS_PUT = "store a new conversation record"
    CONVERSATIONS_UPDATE = "change a conversation record"
    RUN_QUEUES_CREATE = "create a run's queues"
    RUN_QUEUES_DELETE = "delete a run's queues"
    RUN_QUEUES_SEND = "send to run queues"
    RUN_QUEUES_RECEIVE = "receive from run queues"
    RUN_QUEUES_POLL = "let Lambda poll run queues for the consumer"
    QUEUE_ALARMS_CREATE = "create a run's queue alarms"
    QUEUE_ALARMS_DELETE = "delete a run's queue alarms"
    CONSUMER_CONNECT = "connect a run's queue to the consumer"
    CONSUMER_DISCONNECT = "disconnect a run's queue from the consumer"
    PROXY_INVOKE = "call the proxy's function URL"
    # The reward fleet (ECS).
    FLEET_START = "start a run's reward workers"
    FLEET_WATCH = "count a run's reward workers"
    FLEET_STOP = "stop a run's reward workers"
    # The training plane (HyperPod, EKS).
    NODES_SCALE = "scale the training instance group"
    NODES_COUNT = "count the training group's nodes"
    KUBERNETES = "use the EKS cluster's Kubernetes API"
    POD_IDENTITY_CREATE = "give a run's pods the job role"
    POD_IDENTITY_DELETE = "take the job role from a run's pods"
    # The operator running `mtrl` (submit, runs, status, cost, logs, teardown, doctor).
    DEPLOYMENT_READ = "find the deployment from its stacks' outputs"
    DATASETS_UPLOAD = "upload datasets"
    CONFIGS_UPLOAD = "upload configs"
    EXECUTIONS_READ = "read executions and their history"
    REAPER_INVOKE = "ask the reaper to tear a run down"
    PIPELINE_LOGS_READ = "read the pipeline's logs"
    QUEUES_WATCH = "read run queues' depths and ages"
    WORKER_LOGS_READ = "read the reward workers' logs"
    WORKER_IMAGE_CHECK = "check the reward worker's image"
    TRAINER_LOGS_READ = "read the training pods' logs"
    CLUSTERS_CHECK = "check the EKS and HyperPod clusters and the GPU quota"


_TEARDOWN = (
    Need.CONSUMER_DISCONNECT,
    Need.RUN_QUEUES_DELETE,
    Need.QUEUE_ALARMS_DELETE,
)
_RELEASE = (
    Need.FLEET_STOP,
    Need.KUBERNETES,
    Need.POD_IDENTITY_DELETE,
    Need.NODES_SCALE,
    Need.CAPACITY_LEASES,
)
_RELEASE_IDLE = (Need.NODES_SCALE, Need.CAPACITY_LEASES, Need.CAPACITY_LEASES_READ)

# Per principal: the pipeline's functions by step (lambdas/pipeline/), the router's functions,
# the reward workers (task role) and a run's pods (job role).
NEEDS: Mapping[str, tuple[Need, ...]] = {
    "start_run": (Need.EXECUTION_START,),
    "validate": (Need.DATASETS_READ, Need.OUTPUTS_WRITE),
    # RUNS_GET: a retried Register finds the run its first attempt stored.
    "register": (Need.DATASETS_READ, Need.CONFIGS_READ, Need.RUNS_PUT, Need.RUNS_GET),
    "provision": (Need.RUN_QUEUES_CREATE, Need.QUEUE_ALARMS_CREATE, Need.CONSUMER_CONNECT),
    "scale_up": (Need.NODES_SCALE, Need.CAPACITY_LEASES),
    "nodes_ready": (Need.NODES_COUNT, Need.KUBERNETES),
    "start_workers": (Need.CONVERSATIONS_PUT, Need.FLEET_START),
    "workers_healthy": (Need.FLEET_WATCH,),
    "submit_job": (Need.KUBERNETES, Need.POD_IDENTITY_CREATE),
    "monitor": (Need.RUNS_GET, Need.OUTPUTS_LIST, Need.OUTPUTS_READ, Need.KUBERNETES),
    "collect": (Need.OUTPUTS_LIST, Need.OUTPUTS_WRITE),
    "release_compute": _RELEASE,
    "teardown": _TEARDOWN,
    "notify_end": (Need.RUNS_GET, Need.RUNS_PUT, Need.ALERTS_PUBLISH),
    # The reaper also releases idle nodes on request (`mtrl teardown --all-idle`).
    "reap": (
        Need.RUNS_SCAN, Need.RUNS_GET, Need.RUNS_PUT, Need.EXECUTIONS_STOP,
        *_RELEASE, *_RELEASE_IDLE, *_TEARDOWN,
    ),
    "release_idle": _RELEASE_IDLE,
    "proxy": (
        Need.CONVERSATIONS_GET, Need.CONVERSATIONS_PUT, Need.CONVERSATIONS_UPDATE,
        Need.RUN_QUEUES_SEND,
    ),
    "consumer": (Need.CONVERSATIONS_GET, Need.CONVERSATIONS_UPDATE, Need.RUN_QUEUES_POLL),
    # Workers report through the proxy; a message they cannot read goes to the dead-letter queue.
    "reward_worker": (Need.RUN_QUEUES_RECEIVE, Need.RUN_QUEUES_SEND, Need.PROXY_INVOKE),
    # The trainer reads its dataset, writes checkpoints and metrics, and speaks the protocol.
    "run_pods": (
        Need.DATASETS_READ_CURRENT, Need.OUTPUTS_WRITE, Need.RUN_QUEUES_RECEIVE, Need.RUN_QUEUES_SEND,
    ),
    # The operator's managed policy (stack output OperatorPolicyArn), for the `mtrl` commands.
    "operator": (
        Need.DEPLOYMENT_READ, Need.DATASETS_UPLOAD, Need.CONFIGS_UPLOAD, Need.RUNS_SCAN,
        Need.RUNS_GET, Need.EXECUTIONS_READ, Need.OUTPUTS_LIST, Need.OUTPUTS_READ,
        Need.QUEUES_WATCH, Need.FLEET_WATCH, Need.NODES_COUNT, Need.REAPER_INVOKE,
        Need.PIPELINE_LOGS_READ, Need.WORKER_LOGS_READ, Need.TRAINER_LOGS_READ,
        Need.WORKER_IMAGE_CHECK, Need.CLUSTERS_CHECK,
    ),
}  # fmt: skip


class AccessProvider(Protocol):
    """A construct that owns resources some needs are about."""

    provides: frozenset[Need]

    def grant(self, need: Need, role: iam.IRole) -> None: ...


class OperatorPolicy(iam.ManagedPolicy):
    """The managed policy for the people who run `mtrl` (attach it to their role or permission
    set): needs are granted to it as to a role."""

    def add_to_principal_policy(
        self, statement: iam.PolicyStatement
    ) -> iam.AddToPrincipalPolicyResult:
        self.add_statements(statement)
        return iam.AddToPrincipalPolicyResult(statement_added=True)


class StacksAccess:
    """The deployment's own stacks: `mtrl` finds everything from their outputs."""

    provides = frozenset({Need.DEPLOYMENT_READ})

    def __init__(self, stack: Stack, prefix: str) -> None:
        self._stacks = stack.format_arn(
            service="cloudformation", resource="stack", resource_name=f"{prefix}-*/*"
        )

    def grant(self, need: Need, role: iam.IRole) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["cloudformation:DescribeStacks"], resources=[self._stacks])
        )
        acknowledge_resource(
            role,
            "AwsSolutions-IAM5",
            self._stacks,
            "Stack ARNs end in an id CloudFormation assigns; only this deployment's stacks.",
        )


class Allow:
    """Adds statements to roles. Resources named at run time are wildcards cdk-nag flags: each
    one in `wildcards` is acknowledged, on the role it is granted to, with the reason there."""

    def __init__(self, wildcards: Mapping[str, str]) -> None:
        self.wildcards = wildcards

    def __call__(
        self,
        role: iam.IRole,
        actions: list[str],
        *resources: str,
        conditions: Mapping[str, Any] | None = None,
    ) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=actions, resources=list(resources), conditions=conditions)
        )
        for resource in resources:
            if resource in self.wildcards:
                acknowledge_resource(role, "AwsSolutions-IAM5", resource, self.wildcards[resource])


def grant_log_reading(role: iam.IRole, *group_arns: str) -> None:
    """FilterLogEvents on log groups, each named as `arn:...:log-group:<name>:*` — the form IAM
    policies take for most CloudWatch Logs actions (CloudWatch Logs API Reference, LogGroup
    `arn`)."""
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=["logs:FilterLogEvents"], resources=list(group_arns))
    )
    for group in group_arns:
        acknowledge_resource(
            role,
            "AwsSolutions-IAM5",
            group,
            "A log group named as IAM wants it (`:*`: its streams, named by the service at run "
            "time); reading only.",
        )


def log_group_arn(stack: Stack, name: str) -> str:
    """The ARN IAM policies use for a log group (with `:*`)."""
    return stack.format_arn(
        service="logs",
        resource="log-group",
        resource_name=f"{name}:*",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


def grant_needs(roles: Mapping[str, iam.IRole], providers: Iterable[AccessProvider]) -> None:
    """Grant every principal in `roles` (keyed as in NEEDS) what NEEDS says, each need by the
    one provider of it."""
    owner: dict[Need, AccessProvider] = {}
    for provider in providers:
        for need in provider.provides:
            if need in owner:
                raise ValueError(f"{need!r} is provided twice")
            owner[need] = provider
    for principal, role in roles.items():
        # A need listed twice (shared tuples, as the reaper's) is granted once.
        for need in dict.fromkeys(NEEDS[principal]):
            if need not in owner:
                raise LookupError(f"no construct provides {need!r} (needed by {principal})")
            owner[need].grant(need, role)


def grant_table_key(role: iam.IRole, key: kms.IKey, *, writes: bool) -> None:
    """The key of a DynamoDB table, as a caller of the table needs it: what aws-cdk-lib's table
    grants give (DynamoDB uses the key for the caller, and does not publish which KMS calls each
    operation makes; reads decrypt the table key)."""
    actions = ["kms:Decrypt", "kms:DescribeKey"]
    if writes:
        actions += ["kms:Encrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*"]
    role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=[key.key_arn]))
    if writes:
        acknowledge_key_grant(role, "DynamoDB items under the data key")
