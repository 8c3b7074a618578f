"""The deployed app's scenarios, played once per test session (on one worker: every test of this
package is in the xdist group "deployed"), for the behaviour tests and the IAM proof alike:

The deployment has both training planes: the standard group for open-weights models and a
restricted group for Nova, whose jobs AWS's launcher starts (its processes faked).

- "succeeds": a run of an open-weights model with a config of its own (workers scale on the
  backlog) runs to the end;
- "nova succeeds": a Nova run (the deployment's default config) on the restricted group, its
  job started and stopped by the launcher function; at work, the job records its checkpoints
  and its planes exchange rollouts (whose reports make the run's reward curve);
- "job cannot start": its trainer image cannot be pulled; the run fails, all is released;
- "invalid dataset": refused at validation, nothing created;
- "stopped by hand": stopped in the console while its planes exchange rollouts (trainer,
  reward worker, router); the reaper's schedule tears it down, `mtrl teardown` repeats it;
- "torn down on request": `mtrl teardown RUN` while it runs;
- "nova held": a Nova run whose planes exchange rollouts (the Nova trainer as the restricted
  group's execution role, its first rollout through the run's rollout Lambda), then torn down
  on request;
- "serverless succeeds": a Wordle run on the serverless plane (examples/wordle/serverless.yaml):
  its managed job, started by the pipeline, reads its train channel and sends rollout requests
  to the agent Lambda as the job role; the run's worker plays them at the job's runtime as the
  workers' role; then the job completes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from domain.bucket import CONFIG_METADATA_KEY
from domain.episodes import EvaluationStage
from lambdas.pipeline.steps import STEP
from mtrl.local.physical import REGION
from stacks.components.hyperpod_dependencies import chart_request
from stacks.render_hyperpod_chart import render
from tests.chart_rendering import manifest, rendering
from tests.conftest import Synthesized
from tests.executions import wait_for_state
from tests.iam.world import (
    JobController,
    World,
    custom_resource,
    dataset,
    deployed_world,
    exchange_rollouts,
    managed_job_at_work,
    nova_recipe,
    publish_stacks,
    run_cli,
    write_episodes_as_the_evaluator,
    write_manifest_as_the_nova_job,
    write_metrics_as_the_trainer,
)
from tests.kubernetes import eks_addons
from training_configs import load_training_config

SCALING_CONFIG = "configs/scaling.yaml"
OPEN_WEIGHTS_CONFIG = "configs/qwen.yaml"
ITERATIVE_CONFIG = "configs/again.yaml"  # trains on from the "nova succeeds" run's checkpoint
SERVERLESS_CONFIG = "configs/serverless.yaml"  # examples/wordle/serverless.yaml
SERVERLESS_EXAMPLE = Path(__file__).parents[2] / "examples/wordle/serverless.yaml"


# The proof's modules share its session fixtures (the deployed world, its scenarios): each marks
# itself `pytestmark = ON_ONE_WORKER`, so `--dist loadgroup` runs them on one worker and the
# world is built once. (Marks added by a collection hook here came after pytest-xdist's own
# hook had read them: the world was built on both workers.)
ON_ONE_WORKER = pytest.mark.xdist_group("deployed")


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
    summary: dict[str, Any] | None = None  # runs/<run_id>/summary.json, when Collect wrote it
    metrics: list[dict[str, Any]] = field(default_factory=list)  # runs/<run_id>/metrics.jsonl
    evaluation: dict[str, Any] | None = None  # runs/<run_id>/evaluation.json
    trained_on: list[dict[str, Any]] = field(
        default_factory=list
    )  # runs/<run_id>/data/training.jsonl


@dataclass
class Scenarios:
    world: World
    controller: JobController
    runs: dict[str, Scenario] = field(default_factory=dict)
    notifications: list[str] = field(default_factory=list)
    exchange: dict[str, Any] = field(default_factory=dict)
    reaped: list[dict[str, Any]] = field(default_factory=list)
    nova_exchange: dict[str, Any] = field(default_factory=dict)
    nova_rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)  # by run id
    nova_evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)  # by run, stage
    nova_reaped: dict[str, Any] = field(default_factory=dict)
    # What each serverless run's job played (world.managed_job_at_work), by job name.
    agent_answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    monkeypatch: Any = None
    cli: dict[str, Any] = field(default_factory=dict)  # `mtrl` command -> its CliRunner result
    rbac: list[dict[str, Any]] = field(default_factory=list)  # the custom resource's answers
    chart: list[dict[str, Any]] = field(default_factory=list)  # the chart install's answers
    mlflow_files: list[str] = field(default_factory=list)  # the tracking server's artifact keys

    def use_the_cli(self, tmp: Path) -> None:
        """The operator's commands, after the runs: each reads or changes the deployment."""
        world, run_id = self.world, self.runs["succeeds"].run_id
        played = self.runs["stopped by hand"].run_id  # its worker kept its rollouts
        nova = self.runs["nova succeeds"].run_id
        serverless = self.runs["serverless succeeds"].run_id
        config = tmp / "mine.yaml"
        config.write_text(
            yaml.safe_dump(load_training_config("rft_multiturn_lora").model_dump(mode="json"))
        )
        data = tmp / "operator.jsonl"
        data.write_bytes(dataset())
        commands = {
            "doctor": ("doctor",),
            "submit": ("submit", str(data), "--config", str(config)),
            "runs": ("runs",),
            "cost": ("cost", run_id),
            "logs pipeline": ("logs", run_id, "--plane", "pipeline"),
            "logs workers": ("logs", run_id, "--plane", "workers"),
            "logs trainer": ("logs", run_id, "--plane", "trainer"),
            "trajectories": ("trajectories", played, "--worst", "1", "--out", str(tmp)),
            "teardown": ("teardown", run_id),
            "deploy": ("deploy", nova, "--to", "bedrock"),
            "deploy --delete": ("deploy", nova, "--delete"),
            "cost serverless": ("cost", serverless),
            "deploy serverless": ("deploy", serverless, "--to", "bedrock"),
            "deploy serverless --delete": ("deploy", serverless, "--delete"),
            "deploy open weights": ("deploy", run_id, "--to", "sagemaker"),
            "deploy open weights --delete": ("deploy", run_id, "--delete"),
        }
        for name, command in commands.items():
            self.cli[name] = run_cli(world, self.monkeypatch, *command)

    @contextlib.contextmanager
    def _recorded(self, name: str, outcome: str) -> Iterator[dict[str, Any]]:
        world = self.world
        self.controller.outcome = outcome
        marks = (
            len(world.recorder.calls),
            len(world.kubernetes.requests),
            len(world.sagemaker.updates),
        )
        started: dict[str, Any] = {}
        yield started
        sfn = world.clients["stepfunctions"]
        run = Scenario(
            run_id=started["run_id"],
            described=sfn.describe_execution(executionArn=started["execution_arn"]),
            calls=slice(marks[0], len(world.recorder.calls)),
            kubernetes=slice(marks[1], len(world.kubernetes.requests)),
            updates=slice(marks[2], len(world.sagemaker.updates)),
        )
        run.left = _left(world, run)
        run.summary = _output(world, run.run_id, "summary.json")
        run.evaluation = _output(world, run.run_id, "evaluation.json")
        run.trained_on = _output(world, run.run_id, "data/training.jsonl", lines=True) or []
        metrics = _output(world, run.run_id, "metrics.jsonl", lines=True)
        run.metrics = metrics or []
        self.runs[name] = run

    def run(
        self, name: str, key: str, body: bytes, *, outcome: str, config: str | None = None
    ) -> None:
        with self._recorded(name, outcome) as started:
            metadata = {CONFIG_METADATA_KEY: config} if config else None
            started |= self.world.upload(key, body, metadata)
            self.world.finish(started["execution_arn"])

    def run_stopped_by_hand(self) -> None:
        world = self.world
        with self._recorded("stopped by hand", "hold") as started:
            key = "training-data/held.jsonl"
            started |= world.upload(key, dataset(), {CONFIG_METADATA_KEY: SCALING_CONFIG})
            wait_for_state(world.clients["stepfunctions"], started["execution_arn"], "WaitForJob")
            world.clients["stepfunctions"].stop_execution(
                executionArn=started["execution_arn"], error="Stopped", cause="by hand"
            )
            # Stopping the execution stops nothing the run made: its planes go on until reaped.
            self.exchange = exchange_rollouts(world, started["run_id"], key)
            self.cli["status"] = run_cli(world, self.monkeypatch, "status", started["run_id"])
            self.reaped = [
                world.invoke(
                    STEP["reap"].handler, {"source": "aws.events", "detail-type": "Scheduled Event"}
                ),
                world.invoke(STEP["reap"].handler, {"run_id": started["run_id"]}),
                world.invoke(STEP["reap"].handler, {"release_idle": True}),
            ]

    def run_torn_down_on_request(self) -> None:
        world = self.world
        with self._recorded("torn down on request", "hold") as started:
            started |= world.upload(
                "training-data/unwanted.jsonl",
                dataset(),
                {CONFIG_METADATA_KEY: OPEN_WEIGHTS_CONFIG},
            )
            wait_for_state(world.clients["stepfunctions"], started["execution_arn"], "WaitForJob")
            self.reaped.append(world.invoke(STEP["reap"].handler, {"run_id": started["run_id"]}))
            world.finish(started["execution_arn"])  # the interpreter notices the stop

    def nova_at_work(self, job: str) -> None:
        """A Nova job once it runs: it records its checkpoints; a job that goes on to complete
        exchanges its rollouts then (a held one's are exchanged by its scenario, while it
        holds)."""
        world = self.world
        recipe = nova_recipe(world, job)
        run = recipe["run"]
        run_id = urlsplit(run["output_s3_path"]).path.strip("/").split("/")[1]
        dataset_key = urlsplit(run["data_s3_path"]).path.lstrip("/")
        if "evaluation" in recipe:  # AWS's evaluation: one rollout, in its stage's phase
            stage = EvaluationStage(PurePosixPath(urlsplit(run["output_s3_path"]).path).name)
            self.nova_evaluations.setdefault(run_id, {})[stage] = exchange_rollouts(
                world, run_id, dataset_key, 1, nova=True, stage=stage
            )
            return
        write_manifest_as_the_nova_job(world, job)
        if self.controller.outcome != "complete":
            return
        self.nova_rollouts[run_id] = exchange_rollouts(world, run_id, dataset_key, nova=True)

    def managed_job_at_work(self, name: str, job: dict[str, Any]) -> None:
        """A serverless run's job as SageMaker starts it: at work, then completed."""
        self.agent_answers[name] = managed_job_at_work(self.world, job)
        self.world.managed_jobs.finish(name, "Completed")

    def run_nova_held(self) -> None:
        world = self.world
        with self._recorded("nova held", "hold") as started:
            key = "training-data/nova-held.jsonl"
            started |= world.upload(key, dataset())
            wait_for_state(world.clients["stepfunctions"], started["execution_arn"], "WaitForJob")
            self.nova_exchange = exchange_rollouts(world, started["run_id"], key, nova=True)
            self.nova_reaped = world.invoke(STEP["reap"].handler, {"run_id": started["run_id"]})
            world.finish(started["execution_arn"])


def _output(world: World, run_id: str, name: str, *, lines: bool = False) -> Any:
    """The run's output `name` as JSON (`lines`: JSON lines), None when there is none."""
    s3, bucket, key = world.clients["s3"], world.pipeline.data_bucket, f"runs/{run_id}/{name}"
    if not s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount"):
        return None
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return [json.loads(line) for line in body.splitlines()] if lines else json.loads(body)


def _left(world: World, run: Scenario) -> dict[str, Any]:
    """The run's ECS services still active, task definitions, token parameters and queues."""
    ecs = world.harness.client("ecs")
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
        "parameters": len(world.harness.client("ssm").describe_parameters()["Parameters"]),
        "queues": [
            u
            for u in world.clients["sqs"].list_queues().get("QueueUrls", [])
            if u.rsplit("/", 1)[-1] != "inbox"
        ],
    }


def publish_chart_rendering(world: World, cache: Path) -> None:
    """What `cdk deploy` uploads for the chart before the stacks change: the renderer's output
    (git and helm faked, as in tests/test_render_hyperpod_chart.py) in the bootstrap bucket; and
    the EKS add-ons the chart waits for (their objects, as EKS installs them)."""
    eks_addons.install(world.kubernetes.objects)
    ((stack, _, chart),) = world.deployment.resources("Custom::HyperPodHelmChart")
    asset = world.deployment.resolve(stack, chart["Properties"]["Manifest"])
    request = replace(chart_request(world.app.config), region=REGION)
    objects = rendering(kubeflow=request.kubeflow_training_operator)
    path = render(request, cache=cache, run=lambda argv, cwd: manifest(objects))
    s3 = world.clients["s3"]
    s3.create_bucket(Bucket=asset["Bucket"])
    s3.put_object(Bucket=asset["Bucket"], Key=asset["Key"], Body=path.read_bytes())


@pytest.fixture(scope="session")
def scenarios(nova_app: Synthesized, tmp_path_factory: pytest.TempPathFactory) -> Scenarios:
    """Played, and the world closed again (moto, the fakes and the recorder hooks are process
    wide): the tests read the records and what was observed meanwhile."""
    with (
        pytest.MonkeyPatch.context() as monkeypatch,
        deployed_world(nova_app, monkeypatch) as world,
    ):
        controller = JobController(world.kubernetes, world.sagemaker)
        controller.on_running = lambda namespace: write_metrics_as_the_trainer(world, namespace)
        controller.on_evaluating = lambda namespace, stage: write_episodes_as_the_evaluator(
            world, namespace, stage
        )
        world.kubernetes.on_request = controller
        # Configs of their own (as `mtrl submit` uploads them) for an open-weights model, one
        # whose workers scale on the backlog.
        config = load_training_config("rft_multiturn_lora").model_dump(mode="json")
        config |= {"name": "qwen", "model": "qwen3-8b", "instance_count": 1}
        for key, changes in (
            (OPEN_WEIGHTS_CONFIG, {}),
            (SCALING_CONFIG, {"name": "scaling", "reward_workers_max": 8}),
        ):
            world.clients["s3"].put_object(
                Bucket=world.pipeline.data_bucket,
                Key=key,
                Body=yaml.safe_dump(config | changes).encode(),
            )
        world.clients["s3"].put_object(
            Bucket=world.pipeline.data_bucket, Key=SERVERLESS_CONFIG,
            Body=SERVERLESS_EXAMPLE.read_bytes(),
        )  # fmt: skip
        publish_stacks(world)
        played = Scenarios(world, controller, monkeypatch=monkeypatch)
        controller.on_nova_running = played.nova_at_work
        # The deploy installs AWS's HyperPod chart (rendered at publish time: its asset) before
        # the HyperPod cluster, then the pipeline's Kubernetes RBAC.
        publish_chart_rendering(world, tmp_path_factory.mktemp("chart"))
        played.chart.append(custom_resource(world, "Custom::HyperPodHelmChart", "Create"))
        played.rbac.append(custom_resource(world, "Custom::KubernetesRbac", "Create"))
        played.run(
            "succeeds",
            "training-data/wordle.jsonl",
            dataset(),
            outcome="complete",
            config=SCALING_CONFIG,
        )
        played.run("nova succeeds", "training-data/nova.jsonl", dataset(), outcome="complete")
        again = load_training_config("rft_multiturn_lora").model_dump(mode="json") | {
            "name": "again",
            "base_checkpoint": f"run:{played.runs['nova succeeds'].run_id}",
        }
        world.clients["s3"].put_object(
            Bucket=world.pipeline.data_bucket,
            Key=ITERATIVE_CONFIG,
            Body=yaml.safe_dump(again).encode(),
        )
        played.run(
            "nova trains on",
            "training-data/nova-again.jsonl",
            dataset(),
            outcome="complete",
            config=ITERATIVE_CONFIG,
        )
        played.run(
            "job cannot start",
            "training-data/wordle-2.jsonl",
            dataset(),
            outcome="bad_image",
            config=OPEN_WEIGHTS_CONFIG,
        )
        played.run(
            "invalid dataset", "training-data/broken.jsonl", b"{not json\n", outcome="complete"
        )
        played.run_stopped_by_hand()
        played.run_torn_down_on_request()
        played.run_nova_held()
        world.managed_jobs.on_created = played.managed_job_at_work
        played.run(
            "serverless succeeds", "training-data/serverless.jsonl", dataset(),
            outcome="complete", config=SERVERLESS_CONFIG,
        )  # fmt: skip
        played.use_the_cli(tmp_path_factory.mktemp("operator"))
        # `make destroy` removes it again.
        played.rbac.append(custom_resource(world, "Custom::KubernetesRbac", "Delete"))
        played.chart.append(custom_resource(world, "Custom::HyperPodHelmChart", "Delete"))
        played.notifications = world.notifications()
        listed = world.clients["s3"].list_objects_v2(
            Bucket=world.pipeline.data_bucket, Prefix="mlflow/"
        )
        played.mlflow_files = [item["Key"] for item in listed.get("Contents", [])]
    return played
