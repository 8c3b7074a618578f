"""The IAM proof: with the pipeline's scenarios played offline on its AWS backends (every
function, worker and pod signing as its own role), every AWS request and every Kubernetes
request is checked against what the synthesized templates grant the principal that made it."""

from __future__ import annotations

import json

import pytest

from tests.iam.conftest import Scenarios
from tests.iam.policy import Request, as_list
from tests.iam.proof import Proof, Report


@pytest.fixture(scope="module")
def report(scenarios: Scenarios) -> Report:
    world = scenarios.world
    proof = Proof(world.deployment, world.directory)
    checked = proof.check(world.recorder.calls)
    (rbac,) = [r for _, _, r in world.deployment.resources("Custom::KubernetesRbac")]
    proof.check_kubernetes(
        checked, world.kubernetes.callers, json.loads(rbac["Properties"]["Objects"])
    )
    return checked


def test_every_aws_request_is_allowed(report: Report) -> None:
    assert report.requests > 100
    assert report.denied == [], "\n".join(sorted(set(report.denied)))


def test_every_kubernetes_request_is_allowed(report: Report) -> None:
    assert report.kubernetes_denied == [], "\n".join(sorted(set(report.kubernetes_denied)))


def test_the_state_machine_may_invoke_every_function_its_states_call(scenarios: Scenarios) -> None:
    """Step Functions invokes each Task's function with the state machine's role."""
    deployment = scenarios.world.deployment
    ((stack, logical_id, machine),) = deployment.resources("AWS::StepFunctions::StateMachine")
    definition = json.loads(deployment.resolve(stack, machine["Properties"]["DefinitionString"]))
    # Tasks invoke their function directly (payload only): the Resource is its ARN.
    functions = {
        state["Resource"] for state in definition["States"].values() if state["Type"] == "Task"
    }
    assert len(functions) >= 12
    role = deployment.resolve(stack, machine["Properties"]["RoleArn"])
    policies = deployment.policies(role)
    for function in functions:
        assert policies.evaluate(Request("lambda:InvokeFunction", function)).allowed, function


def test_each_rule_may_invoke_its_target_and_dead_letter_its_events(scenarios: Scenarios) -> None:
    """EventBridge needs the target function's resource policy (and the dead-letter queue's)
    to name the rule (EventBridge User Guide, "Using resource-based policies")."""
    deployment = scenarios.world.deployment
    permissions = [
        deployment.resolve(stack, resource["Properties"])
        for stack, _, resource in deployment.resources("AWS::Lambda::Permission")
    ]
    queue_policies = [
        deployment.resolve(stack, resource["Properties"])
        for stack, _, resource in deployment.resources("AWS::SQS::QueuePolicy")
    ]
    rules = list(deployment.resources("AWS::Events::Rule"))
    assert len(rules) >= 2
    for stack, logical_id, rule in rules:
        rule_arn = deployment.names[stack][logical_id]["Arn"]
        for target in deployment.resolve(stack, rule["Properties"]["Targets"]):
            assert [
                p for p in permissions
                if p["Principal"] == "events.amazonaws.com" and p["Action"] == "lambda:InvokeFunction"
                and p["FunctionName"] == target["Arn"] and p.get("SourceArn") == rule_arn
            ], f"{logical_id} cannot invoke {target['Arn']}"  # fmt: skip
            if "DeadLetterConfig" in target:
                queue = target["DeadLetterConfig"]["Arn"]
                allowing = [
                    statement
                    for policy in queue_policies
                    for statement in policy["PolicyDocument"]["Statement"]
                    if statement["Effect"] == "Allow"
                    and statement.get("Principal") == {"Service": "events.amazonaws.com"}
                    and queue in as_list(statement["Resource"])
                    and rule_arn in json.dumps(statement.get("Condition", {}))
                ]
                assert allowing, f"{logical_id}'s dead letters cannot reach {queue}"
