"""The deployed app's scenarios, run once per test session (on one worker: every test of this
package is in the xdist group "deployed"), for the behaviour tests and the IAM proof alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from tests.conftest import Synthesized
from tests.iam.world import JobController, World, dataset, deployed_world


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "iam":
            item.add_marker(pytest.mark.xdist_group("deployed"))


@dataclass
class Scenario:
    """One run, the share of the records it made (slices of the recorders' lists), and what
    was left of it in AWS right after it ended (`left`)."""

    run_id: str
    described: dict[str, Any]
    calls: slice
    kubernetes: slice
    updates: slice
    left: dict[str, Any] = field(default_factory=dict)


@dataclass
class Scenarios:
    world: World
    runs: dict[str, Scenario] = field(default_factory=dict)
    notifications: list[str] = field(default_factory=list)

    def run(
        self, name: str, key: str, body: bytes, controller: JobController, outcome: str
    ) -> None:
        world = self.world
        controller.outcome = outcome
        marks = (
            len(world.recorder.calls),
            len(world.kubernetes.requests),
            len(world.sagemaker.updates),
        )
        started = world.upload(key, body)
        described = world.finish(started["execution_arn"])
        run = Scenario(
            run_id=started["run_id"],
            described=described,
            calls=slice(marks[0], len(world.recorder.calls)),
            kubernetes=slice(marks[1], len(world.kubernetes.requests)),
            updates=slice(marks[2], len(world.sagemaker.updates)),
        )
        run.left = _left(world, run)
        self.runs[name] = run


def _left(world: World, run: Scenario) -> dict[str, Any]:
    """The run's ECS services still active, task definitions, token parameters and queues."""
    ecs = boto3.client("ecs")
    created = [c.params for c in world.recorder.calls[run.calls] if c.operation == "CreateService"]
    services = [
        service["status"]
        for params in created
        for service in ecs.describe_services(
            cluster=params["cluster"], services=[params["serviceName"]]
        )["services"]
    ]
    families = {p["taskDefinition"].rsplit("/", 1)[-1].rsplit(":", 1)[0] for p in created}
    return {
        "active services": services.count("ACTIVE"),
        "task definitions": sum(
            len(ecs.list_task_definitions(familyPrefix=f, status="ACTIVE")["taskDefinitionArns"])
            for f in families
        ),
        "parameters": len(boto3.client("ssm").describe_parameters()["Parameters"]),
        "queues": [
            u
            for u in world.clients["sqs"].list_queues().get("QueueUrls", [])
            if u.rsplit("/", 1)[-1] != "inbox"
        ],
    }


@pytest.fixture(scope="session")
def scenarios(default_app: Synthesized) -> Scenarios:
    """Played, and the world closed again (moto, the fakes and the recorder hooks are process
    wide): the tests read the records and what was observed meanwhile."""
    with (
        pytest.MonkeyPatch.context() as monkeypatch,
        deployed_world(default_app, monkeypatch) as world,
    ):
        controller = JobController(world.kubernetes, world.sagemaker)
        world.kubernetes.on_request = controller
        played = Scenarios(world)
        played.run("succeeds", "training-data/wordle.jsonl", dataset(), controller, "complete")
        played.run(
            "job cannot start", "training-data/wordle-2.jsonl", dataset(), controller, "bad_image"
        )
        played.run(
            "invalid dataset", "training-data/broken.jsonl", b"{not json\n", controller, "complete"
        )
        played.notifications = world.notifications()
    return played
