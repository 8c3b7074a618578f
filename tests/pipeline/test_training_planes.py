"""A run's model picks its training plane; a teardown that knows only the run's id asks every
plane; a Nova run on a deployment without a restricted group is refused with the fix."""

from __future__ import annotations

from dataclasses import replace

import boto3
import pytest

from domain.backends import JobStatus, Phase, RunContext, TrainingCluster
from domain.episodes import EvaluationStage
from domain.nova_job import NovaRefused
from lambdas.clients import Clients
from lambdas.pipeline.composition import deployed_compute
from lambdas.pipeline.compute import teardown_context
from lambdas.pipeline.hyperpod_training import HyperPodTrainingCluster
from lambdas.pipeline.nova_training import NovaTrainingCluster
from lambdas.pipeline.serverless_training import ServerlessTrainingCluster
from lambdas.pipeline.training_planes import TrainingPlanes
from training_configs.schema import load_training_config

NOVA = RunContext(
    run_id="r", queues={}, router_url=None, run_token="", bucket="b", dataset_key="k",
    dataset_version=None, output_prefix="runs/r/", config=load_training_config("rft_multiturn_lora"),
)  # fmt: skip
QWEN = replace(NOVA, config=NOVA.training.model_copy(update={"model": "qwen3-8b"}))


class Recording(TrainingCluster):
    """A plane that says what was asked of it (the routing is what is under test)."""

    def __init__(self, name: str) -> None:
        self.name, self.asked = name, []

    def _ask(self, what: str, run: RunContext | None = None, detail: object = None) -> None:
        self.asked.append((what, run.run_id if run else None, detail))

    def scale_up(self, run: RunContext, *, instances: int) -> None:
        self._ask("scale_up", run, instances)

    def nodes_ready(self, run: RunContext) -> int:
        self._ask("nodes_ready", run)
        return 1

    def submit(self, run: RunContext) -> str:
        self._ask("submit", run)
        return self.name

    def status(self, run: RunContext) -> JobStatus:
        self._ask("status", run)
        return JobStatus(Phase.RUNNING, self.name)

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        self._ask("submit_evaluation", run, stage)
        return f"{self.name}-{stage}"

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        self._ask("evaluation_status", run, stage)
        return JobStatus(Phase.SUCCEEDED, self.name)

    def delete(self, run: RunContext) -> int:
        self._ask("delete", run)
        return 2

    def scale_down(self, run: RunContext) -> None:
        self._ask("scale_down", run)

    def release_idle(self, *, immediately: bool = False) -> bool:
        self._ask("release_idle", detail=immediately)
        return self.name == "nova"


def test_the_runs_model_picks_its_plane() -> None:
    standard, nova = Recording("standard"), Recording("nova")
    planes = TrainingPlanes(standard=standard, nova=nova)
    assert planes.submit(NOVA) == "nova" and planes.submit(QWEN) == "standard"
    assert planes.status(NOVA).reason == "nova"
    planes.scale_up(QWEN, instances=2)
    assert planes.nodes_ready(QWEN) == 1
    assert planes.delete(NOVA) == 2
    planes.scale_down(NOVA)
    final, baseline = EvaluationStage.FINAL, EvaluationStage.BASELINE
    assert planes.submit_evaluation(QWEN, stage=final) == "standard-final"
    assert planes.evaluation_status(NOVA, stage=baseline).reason == "nova"
    assert nova.asked == [("submit", "r", None), ("status", "r", None), ("delete", "r", None),
                          ("scale_down", "r", None), ("evaluation_status", "r", baseline)]  # fmt: skip
    assert standard.asked == [
        ("submit", "r", None),
        ("scale_up", "r", 2),
        ("nodes_ready", "r", None),
        ("submit_evaluation", "r", final),
    ]


def test_a_teardown_by_run_id_asks_every_plane_and_idle_nodes_are_released_everywhere() -> None:
    standard, nova = Recording("standard"), Recording("nova")
    planes = TrainingPlanes(standard=standard, nova=nova)
    assert planes.delete(teardown_context("r")) == 4
    planes.scale_down(teardown_context("r"))
    assert planes.release_idle() is True  # the Nova plane released some
    assert planes.release_idle(immediately=True) is True
    for plane in (standard, nova):  # both were asked
        assert plane.asked == [
            ("delete", "r", None), ("scale_down", "r", None), ("release_idle", None, False),
            ("release_idle", None, True),
        ]  # fmt: skip


def test_a_nova_run_without_a_restricted_group_is_refused_with_the_fix() -> None:
    planes = TrainingPlanes(standard=Recording("standard"), nova=None)
    with pytest.raises(NovaRefused, match="this deployment has none; add one to "
                       r"hyperpod_instance_groups \(restricted: true, with its fsx\)"):  # fmt: skip
        planes.submit(NOVA)
    assert planes.delete(teardown_context("r")) == 2  # the one plane there is


def test_the_deployed_composition_has_the_nova_plane_where_the_stack_set_it() -> None:
    clients = Clients(boto3.Session(region_name="us-east-1"))
    environment = {
        "NAME_PREFIX": "p", "CAPACITY_LEASES_TABLE": "l", "EKS_CLUSTER": "e",
        "HYPERPOD_CLUSTER": "h", "HYPERPOD_INSTANCE_GROUP": "gpu",
        "HYPERPOD_INSTANCE_TYPE": "ml.p5.48xlarge", "MODEL_PRESETS": "{}", "ACCOUNT_ID": "1",
        "TRAINING_JOB_ROLE_ARN": "arn:aws:iam::1:role/j", "AWS_REGION": "us-east-1",
        "CONVERSATIONS_TABLE": "c",
    }  # fmt: skip
    without = deployed_compute(environment, clients).cluster
    assert isinstance(without, TrainingPlanes) and without.nova is None
    assert isinstance(without.standard, HyperPodTrainingCluster)
    nova = {"NOVA_INSTANCE_GROUP": "nova", "NOVA_INSTANCE_TYPE": "ml.p5.48xlarge",
            "NOVA_LAUNCHER_FUNCTION": "p-nova-launcher"}  # fmt: skip
    with_nova = deployed_compute({**environment, **nova}, clients).cluster
    assert isinstance(with_nova.nova, NovaTrainingCluster)
    assert with_nova.nova.capacity.group == "nova"
    assert with_nova.serverless is None
    serverless = {"SERVERLESS_JOB_ROLE_ARN": "arn:aws:iam::1:role/s",
                  "AGENT_FUNCTION_ARN": "arn:aws:lambda:us-east-1:1:function:p-agent-rft"}  # fmt: skip
    with_serverless = deployed_compute({**environment, **serverless}, clients).cluster
    assert isinstance(with_serverless.serverless, ServerlessTrainingCluster)
    assert with_serverless.serverless.settings.agent_function_arn.endswith(":p-agent-rft")
