"""What each function and workload of the platform may do in AWS, declared once.

`NEEDS` names, per principal, the needs it has (`Need`); the constructs that own the resources
turn each need into the narrowest statements IAM allows (`AccessProvider.grant`). The IAM proof
(tests/iam/) checks every request the pipeline makes against what this table grants, and every
grant against the requests: a need added here and never used, or used and not here, fails it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms

from domain.naming import OUTPUT_STACKS, stack_name
from domain.needs import Need
from lambdas.pipeline.steps import STEPS
from stacks.components.nag import (
    Wildcard,
    acknowledge_key_grant,
    acknowledge_no_resource_type,
    acknowledge_resource,
)

# Per principal: the pipeline's functions by step (lambdas/pipeline/steps.py), the
# router's functions, the reward workers (task role) and a run's pods (job role).
NEEDS: Mapping[str, tuple[Need, ...]] = {
    **{step.name: step.needs for step in STEPS},
    "proxy": (
        Need.CONVERSATIONS_GET, Need.CONVERSATIONS_PUT, Need.CONVERSATIONS_UPDATE,
        Need.RUN_QUEUES_SEND,
    ),
    "consumer": (Need.CONVERSATIONS_GET, Need.CONVERSATIONS_UPDATE, Need.RUN_QUEUES_POLL),
    # CONVERSATIONS_GET: the run's open phase.
    "rollout_forwarder": (
        Need.ROLLOUT_REQUESTS_FORWARD, Need.CONVERSATIONS_GET, Need.CONVERSATIONS_PUT,
    ),
    # The serverless plane's agent Lambda: as the rollout forwarder, for a managed job's run.
    "agent_forwarder": (
        Need.ROLLOUT_REQUESTS_FORWARD, Need.CONVERSATIONS_GET, Need.CONVERSATIONS_PUT,
    ),
    # AWS's launcher (a deployment with a restricted group): helm in the kubeflow namespace.
    "nova_launcher": (Need.NOVA_CHART,),
    # Workers report through the proxy; a message they cannot read goes to the dead-letter queue;
    # every rollout they finish goes to the run's trajectory store.
    # A serverless run's workers sample its job's policy and report to the job's runtime.
    "reward_worker": (
        Need.RUN_QUEUES_RECEIVE, Need.RUN_QUEUES_SEND, Need.PROXY_INVOKE, Need.TRAJECTORIES_WRITE,
        Need.JOB_RUNTIME,
    ),
    # The open-weights trainer (llm_trainer/) reads its dataset (the version the run started
    # with; an unversioned object as it is), writes checkpoints and metrics, speaks the
    # protocol; it finds its own checkpoints by listing (a restart resumes), reads them back
    # (resume, a base checkpoint, the final evaluation) and an eval_dataset file, and deletes
    # the step checkpoints it no longer keeps; a gated model's Hub token from its secret.
    "run_pods": (
        Need.DATASETS_READ, Need.DATASETS_READ_CURRENT, Need.EVALUATION_DATA_READ,
        Need.OUTPUTS_LIST, Need.OUTPUTS_READ, Need.OUTPUTS_WRITE, Need.CHECKPOINTS_PRUNE,
        Need.RUN_QUEUES_RECEIVE, Need.RUN_QUEUES_SEND, Need.HUB_TOKENS_READ,
    ),
    # A Nova job, whose only identity is the restricted group's execution role (AWS's RIG
    # docs): its dataset and outputs, the run's queues, and the run's rollout Lambda (BYOO).
    # OUTPUTS_READ: the records written for it (held-out ones apart, domain/evaluation.py).
    # EXPERIMENTS_LOG: its recipe names the deployment's MLflow server, where it has one.
    "nova_job": (
        Need.DATASETS_READ_CURRENT, Need.OUTPUTS_READ, Need.OUTPUTS_WRITE, Need.RUN_QUEUES_RECEIVE,
        Need.RUN_QUEUES_SEND, Need.ROLLOUT_LAMBDA_INVOKE, Need.EXPERIMENTS_LOG,
    ),
    # A serverless run's managed jobs (the serverless plane's job role): their train and
    # evaluation channels and outputs under the run's, the agent Lambda, and what AWS's managed
    # policy for job roles gives it beside (stacks/components/serverless_plane.py).
    "serverless_job": (
        Need.OUTPUTS_LIST, Need.OUTPUTS_READ, Need.OUTPUTS_WRITE, Need.AGENT_INVOKE,
        Need.MANAGED_JOB_SERVICE,
    ),
    # A SageMaker endpoint serving a run's open-weights checkpoint (its model's execution role).
    "model_serving": (Need.CHECKPOINTS_READ,),
    # The operator's managed policy (stack output OperatorPolicyArn), for the `mtrl` commands.
    "operator": (
        Need.DEPLOYMENT_READ, Need.DATASETS_UPLOAD, Need.CONFIGS_UPLOAD, Need.RUNS_SCAN,
        Need.RUNS_GET, Need.EXECUTIONS_READ, Need.OUTPUTS_LIST, Need.OUTPUTS_READ,
        Need.QUEUES_WATCH, Need.FLEET_WATCH, Need.NODES_COUNT, Need.REAPER_INVOKE,
        Need.PIPELINE_LOGS_READ, Need.WORKER_LOGS_READ, Need.TRAINER_LOGS_READ,
        Need.WORKER_IMAGE_CHECK, Need.CLUSTERS_CHECK, Need.MODELS_RELEASE,
        Need.FORGE_RECIPES_READ,  # `mtrl doctor`: the subscription's recipes readable
        Need.TRAJECTORIES_READ,  # `mtrl trajectories`
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
        self._stacks = [
            stack.format_arn(
                service="cloudformation", resource="stack",
                resource_name=f"{stack_name(prefix, part)}/*",
            )
            for part in OUTPUT_STACKS
        ]  # fmt: skip

    def grant(self, need: Need, role: iam.IRole) -> None:
        role.add_to_principal_policy(
            iam.PolicyStatement(actions=["cloudformation:DescribeStacks"], resources=self._stacks)
        )
        # A stack's ARN ends in an id CloudFormation assigns; only this deployment's stacks,
        # each by its whole name.
        for stack in self._stacks:
            acknowledge_resource(role, stack, Wildcard.ASSIGNED_BY_AWS)


class Allow:
    """Adds statements to roles. Resources not known at deploy time are wildcards cdk-nag flags:
    each one in `wildcards` is acknowledged, on the role it is granted to, as the kind it is
    there; `*` (actions without a resource type) is acknowledged as such."""

    def __init__(self, wildcards: Mapping[str, Wildcard]) -> None:
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
            if resource == "*":
                acknowledge_no_resource_type(role)
            elif resource in self.wildcards:
                acknowledge_resource(role, resource, self.wildcards[resource])


def grant_log_reading(role: iam.IRole, *group_arns: str) -> None:
    """FilterLogEvents on log groups, each named as `arn:...:log-group:<name>:*` — the form IAM
    policies take for most CloudWatch Logs actions (CloudWatch Logs API Reference, LogGroup
    `arn`)."""
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=["logs:FilterLogEvents"], resources=list(group_arns))
    )
    for group in group_arns:
        # `:*`: the group's streams, named at run time.
        acknowledge_resource(role, group, Wildcard.NAMED_AT_RUN_TIME)


def log_group_arn(stack: Stack, name: str) -> str:
    """The ARN IAM policies use for a log group (with `:*`)."""
    return stack.format_arn(
        service="logs",
        resource="log-group",
        resource_name=f"{name}:*",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )


def alarm_arn(stack: Stack, name: str) -> str:
    """The ARN of a CloudWatch alarm `name` (a pattern with `*` allowed)."""
    return stack.format_arn(
        service="cloudwatch",
        resource="alarm",
        resource_name=name,
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


def grant_table_action(
    role: iam.IRole, action: str, table: dynamodb.ITable, key: kms.IKey, *, writes: bool
) -> None:
    """One DynamoDB action on `table` (encrypted with `key`), and the key as the action needs it."""
    role.add_to_principal_policy(iam.PolicyStatement(actions=[action], resources=[table.table_arn]))
    grant_table_key(role, key, writes=writes)


def grant_table_key(role: iam.IRole, key: kms.IKey, *, writes: bool) -> None:
    """The key of a DynamoDB table, as a caller of the table needs it: what aws-cdk-lib's table
    grants give (DynamoDB uses the key for the caller, and does not publish which KMS calls each
    operation makes; reads decrypt the table key)."""
    actions = ["kms:Decrypt", "kms:DescribeKey"]
    if writes:
        actions += ["kms:Encrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*"]
    role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=[key.key_arn]))
    if writes:
        acknowledge_key_grant(role)
