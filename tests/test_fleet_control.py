"""The pipeline's rights and settings for per-run reward fleets on ECS (fleet_control.py)."""

from __future__ import annotations

import json

from lambdas.pipeline.ecs_fleet import EcsFleetSettings
from tests.conftest import Synthesized, arn_text, as_list, policy_statements, statements_of_role

FLEET_STEPS = ("StartWorkers", "WorkersHealthy", "ReleaseCompute")


def _function(template: dict, step: str) -> dict:
    (function,) = [
        r for logical_id, r in template["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function" and logical_id.startswith(f"Pipeline{step}Function")
    ]  # fmt: skip
    return function


def test_the_fleet_steps_know_where_the_fleet_lives(default_app: Synthesized) -> None:
    template = default_app.template("pipeline")
    for step in FLEET_STEPS:
        variables = _function(template, step)["Properties"]["Environment"]["Variables"]
        assert variables["WORKER_CLUSTER"] == "nova-mtrl-reward-workers"
        assert variables["WORKER_TASK_DEFINITION"] == "nova-mtrl-reward-worker"
        assert variables["WORKER_LOG_GROUP_PREFIX"] == "/nova-mtrl/reward-workers"
        assert variables["RUN_TOKEN_PARAMETER_PREFIX"] == "/nova-mtrl/runs"
        assert "Fn::Join" in variables["WORKER_SUBNETS"]
        # Every setting the backend reads is there.
        for field in EcsFleetSettings.model_fields.values():
            assert field.alias in variables, field.alias


def test_roles_are_passed_only_to_the_services_that_run_them(default_app: Synthesized) -> None:
    passes = [
        statement for _, statement in policy_statements(default_app.template("pipeline"))
        if "iam:PassRole" in as_list(statement["Action"])
    ]  # fmt: skip
    services = {s["Condition"]["StringEquals"]["iam:PassedToService"] for s in passes}
    # Reward workers (ECS tasks), HyperPod instance groups (SageMaker), run pods (EKS Pod
    # Identity), serverless runs' managed jobs (SageMaker's job service).
    assert services == {
        "ecs-tasks.amazonaws.com", "sagemaker.amazonaws.com", "pods.eks.amazonaws.com",
        "job.sagemaker.amazonaws.com",
    }  # fmt: skip


def test_workers_read_run_queues_and_their_token_only(default_app: Synthesized) -> None:
    """For the principals the docs name: the workers' task role uses this deployment's run
    queues (`<prefix>-run-*`) and reads no parameter; their execution role (what ECS starts a
    task with) reads the runs' token parameters only. No other queue action of the pipeline
    names more than the run queues — or, for StartRun's dead letters, the upload trigger's queue."""
    template = default_app.template("pipeline")
    run_queues = "arn:{Partition}:sqs:{Region}:{AccountId}:nova-mtrl-run-*"

    task = statements_of_role(template, "RewardFleetTaskRole")
    (queues,) = [s for s in task if any(a.startswith("sqs:") for a in as_list(s["Action"]))]
    assert set(as_list(queues["Action"])) == {
        "sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:SendMessage",
    }  # fmt: skip
    assert [arn_text(r) for r in as_list(queues["Resource"])] == [run_queues]
    assert not any("ssm:" in json.dumps(s["Action"]) for s in task)
    execution = statements_of_role(template, "RewardFleetTaskDefinitionExecutionRole")
    (token,) = [s for s in execution if as_list(s["Action"]) == ["ssm:GetParameters"]]
    assert arn_text(token["Resource"]).endswith(":parameter/nova-mtrl/runs/*")
    assert not any("sqs:" in json.dumps(s["Action"]) for s in execution)
    sqs = [
        s for _, s in policy_statements(template)
        if any(a.startswith("sqs:") and a != "sqs:ListQueues" for a in as_list(s["Action"]))
    ]  # fmt: skip
    for statement in sqs:
        for resource in as_list(statement["Resource"]):
            if "Fn::GetAtt" in resource:  # the upload trigger's dead letters, StartRun's too
                assert resource["Fn::GetAtt"][0].startswith("PipelineTriggerDeadLetters")
                assert "sqs:ReceiveMessage" not in as_list(statement["Action"])
                continue
            assert arn_text(resource) == run_queues
