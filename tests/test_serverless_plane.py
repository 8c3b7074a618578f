"""The serverless plane as deployed (stacks/components/serverless_plane.py): who may invoke the
agent Lambda, what the managed job's role is trusted by and may do, who may start, stop and
speak to a run's job — the threat-model claims (docs/operators/security.md) about it."""

from __future__ import annotations

import json
import re

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_

from domain.needs import Need
from domain.serverless_job import agent_function_name, job_role_name
from lambdas.pipeline.serverless_training import ManagedJobSettings
from lambdas.pipeline.steps import STEP
from stacks.components.serverless_plane import JOB_SERVICE, ServerlessPlane
from stacks.pipeline_stack import KNOW_THE_PLANES
from tests.conftest import Synthesized, arn_text, as_list, policy_statements

# The job runtime's actions (AWS's AmazonSageMakerJobRuntimeAccess) and the job's own.
RUNTIME_ACTIONS = {"sagemaker:Sample", "sagemaker:CompleteRollout", "sagemaker:UpdateReward"}
JOB_ACTIONS = {"sagemaker:CreateJob", "sagemaker:DescribeJob", "sagemaker:StopJob"}
# The deployment's training jobs and held-out evaluation jobs.
RUN_JOBS = [
    f"arn:{{Partition}}:sagemaker:{{Region}}:{{AccountId}}:job/{category}/nova-mtrl-run-*"
    for category in ("AgentRFT", "AgentRFTEvaluation")
]
PLANE_NEEDS = {
    Need.MANAGED_JOB_START, Need.MANAGED_JOB_WATCH, Need.MANAGED_EVALUATION_START,
    Need.MANAGED_EVALUATION_WATCH, Need.MANAGED_JOB_STOP,
}  # fmt: skip
JOB_STEPS = tuple(f"Pipeline{s.id}" for s in STEP.values() if set(s.needs) & PLANE_NEEDS)


def _resource_id(app: Synthesized, resource_type: str, prefix: str) -> str:
    (found,) = [i for i in app.resources("pipeline", resource_type) if i.startswith(prefix)]
    return found


def _holders(app: Synthesized, wanted: set[str]) -> dict[str, list[dict]]:
    """Per policy, the statements of any stack that grant one of the `wanted` actions."""
    held: dict[str, list[dict]] = {}
    for template in app.templates.values():
        for policy_id, statement in policy_statements(template):
            if wanted & set(as_list(statement["Action"])):
                held.setdefault(policy_id, []).append(statement)
    return held


def test_only_the_managed_jobs_role_may_invoke_the_agent_lambda(default_app: Synthesized) -> None:
    """The agent Lambda is invoked by the job SageMaker runs as the job role: that role, on the
    function's unqualified ARN, is the one grant; no resource policy opens it to a service,
    another account or anyone."""
    agent = _resource_id(default_app, "AWS::Lambda::Function", "ServerlessPlaneAgent")
    function = default_app.resources("pipeline", "AWS::Lambda::Function")[agent]
    assert function["Properties"]["FunctionName"] == agent_function_name("nova-mtrl")
    invokers = [
        policy_id
        for policy_id, statements in _holders(default_app, {"lambda:InvokeFunction"}).items()
        for statement in statements
        if agent in json.dumps(statement["Resource"])
    ]
    assert invokers and all(i.startswith("ServerlessPlaneJobRole") for i in invokers), invokers
    for template in default_app.templates.values():
        permissions = [
            r for r in template["Resources"].values()
            if r["Type"] == "AWS::Lambda::Permission" and agent in json.dumps(r["Properties"])
        ]  # fmt: skip
        assert permissions == []


def test_the_job_role_is_trusted_by_sagemakers_job_service_in_this_account_only(
    default_app: Synthesized,
) -> None:
    """AWS's MTRL prerequisites: the job's role trusts job.sagemaker.amazonaws.com; and only for
    this account's jobs (aws:SourceAccount). Named as `mtrl plan` shows it in CreateJob."""
    role_id = _resource_id(default_app, "AWS::IAM::Role", "ServerlessPlaneJobRole")
    role = default_app.resources("pipeline", "AWS::IAM::Role")[role_id]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": JOB_SERVICE}
    assert trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    assert role["RoleName"] == job_role_name("nova-mtrl")
    assert "ManagedPolicyArns" not in role


def test_only_the_steps_that_create_jobs_pass_the_job_role_and_only_to_the_job_service(
    default_app: Synthesized,
) -> None:
    role_id = _resource_id(default_app, "AWS::IAM::Role", "ServerlessPlaneJobRole")
    passes = {
        policy_id: statements
        for policy_id, statements in _holders(default_app, {"iam:PassRole"}).items()
        if any(role_id in json.dumps(s["Resource"]) for s in statements)
    }
    creators = ("PipelineSubmitJobFunction", "PipelineStartEvaluationFunction")
    assert sorted(p.rpartition("Function")[0] + "Function" for p in passes) == sorted(creators)
    for statements in passes.values():
        for statement in statements:
            if role_id in json.dumps(statement["Resource"]):
                assert statement["Condition"] == {
                    "StringEquals": {"iam:PassedToService": JOB_SERVICE}
                }


def test_job_grants_reach_only_this_deployments_run_jobs(default_app: Synthesized) -> None:
    """Starting, watching and stopping jobs, and speaking to their runtime, is granted on
    `job/AgentRFT/<prefix>-run-*` and `job/AgentRFTEvaluation/<prefix>-run-*` only; the runtime to the reward workers alone, the job
    actions to the pipeline's steps that need them."""
    held = _holders(default_app, JOB_ACTIONS | RUNTIME_ACTIONS)
    template = default_app.template("pipeline")  # every grant is the pipeline stack's
    assert held and set(held) <= set(template["Resources"])
    for policy_id, statements in held.items():
        for statement in statements:
            actions = set(as_list(statement["Action"])) & (JOB_ACTIONS | RUNTIME_ACTIONS)
            resources = [arn_text(r) for r in as_list(statement["Resource"])]
            assert resources and set(resources) <= set(RUN_JOBS), (policy_id, resources)
            if actions & RUNTIME_ACTIONS:
                assert actions == RUNTIME_ACTIONS
                roles = template["Resources"][policy_id]["Properties"]["Roles"]
                assert "RewardFleetTaskRole" in json.dumps(roles), policy_id
            else:  # the steps whose needs say so (Submit, evaluations, Monitor, Collect, ...)
                assert policy_id.startswith(JOB_STEPS), policy_id


def test_training_jobs_are_created_by_submit_and_evaluation_jobs_by_start_evaluation_only(
    default_app: Synthesized,
) -> None:
    """Each step creates the kind of job it starts and no other; the evaluation steps read the
    training job (its package) but start none, and the watch of an evaluation reads only it."""
    training, evaluation = RUN_JOBS
    granted: dict[str, set[tuple[str, str]]] = {}
    for policy_id, statements in _holders(default_app, JOB_ACTIONS).items():
        step = re.sub(r"(Function)?RoleDefaultPolicy.*", "", policy_id).removeprefix("Pipeline")
        for statement in statements:
            for action in set(as_list(statement["Action"])) & JOB_ACTIONS:
                for resource in as_list(statement["Resource"]):
                    granted.setdefault(step, set()).add((action, arn_text(resource)))
    assert {
        step for step, pairs in granted.items() if ("sagemaker:CreateJob", training) in pairs
    } == {"SubmitJob"}
    assert {
        step for step, pairs in granted.items() if ("sagemaker:CreateJob", evaluation) in pairs
    } == {"StartEvaluation"}
    assert granted["EvaluationStatus"] == {("sagemaker:DescribeJob", evaluation)}
    assert ("sagemaker:DescribeJob", training) in granted["StartEvaluation"]
    assert {step for step, pairs in granted.items() if ("sagemaker:StopJob", evaluation) in pairs} == {
        "ReleaseCompute", "Reaper",
    }  # fmt: skip


def test_the_steps_that_use_the_plane_are_told_its_settings(default_app: Synthesized) -> None:
    """Each step that starts, watches or stops a job, or checks a config against the planes,
    has every setting the serverless plane reads (Lambda sets AWS_REGION itself)."""
    functions = default_app.resources("pipeline", "AWS::Lambda::Function")
    steps = [s for s in STEP.values() if set(s.needs) & PLANE_NEEDS or s.name in KNOW_THE_PLANES]
    assert {"submit_job", "monitor", "collect", "release_compute", "reap", "register"} <= {
        s.name for s in steps
    }
    for step in steps:
        (function,) = [f for i, f in functions.items() if i.startswith(f"Pipeline{step.id}")]
        variables = function["Properties"]["Environment"]["Variables"]
        for field in ManagedJobSettings.model_fields.values():
            assert field.alias in variables or field.alias == "AWS_REGION", (step.name, field)


def test_a_deployment_without_the_plane_has_none_of_it() -> None:
    """`serverless_training: false`: no agent Lambda, job role or checkpoint group, no settings
    (Register then refuses a serverless config with the fix), and its needs grant nothing."""
    stack = cdk.Stack(cdk.App(), "Bare")
    plane = ServerlessPlane(
        stack, "Plane", name_prefix="nova-mtrl", enabled=False, reserved_concurrency=None,
        code=lambda_.Code.from_inline("x"), data_key=kms.Key(stack, "Key"),
        conversations_table="table",
    )  # fmt: skip
    role = cdk.aws_iam.Role(
        stack, "Someone", assumed_by=cdk.aws_iam.ServicePrincipal("lambda.amazonaws.com")
    )
    for need in ServerlessPlane.provides:
        plane.grant(need, role)
    resources = cdk.assertions.Template.from_stack(stack).to_json()["Resources"]
    assert sorted(r["Type"] for r in resources.values()) == ["AWS::IAM::Role", "AWS::KMS::Key"]
    assert plane.agent is None and plane.job_role is None and plane.environment == {}
