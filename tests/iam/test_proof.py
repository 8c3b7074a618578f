"""The IAM proof: with the pipeline's scenarios played offline on its AWS backends (every
function, worker and pod signing as its own role), every AWS request and every Kubernetes
request is checked against what the synthesized templates grant the principal that made it."""

from __future__ import annotations

import json

import pytest

from tests.iam.conftest import Scenarios
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
