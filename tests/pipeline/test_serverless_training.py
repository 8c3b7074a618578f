"""The serverless plane (lambdas/pipeline/serverless_training.py) against botocore's SageMaker
model (its Stubber checks every request and every answer against the model): the run's job is
created once with the document domain/serverless_job.py builds, its records beside the run's
outputs (moto's S3); DescribeJob's statuses become the run's phases; each held-out evaluation is
an AgentRFTEvaluation job of the base model or the trained package, its episodes the reports of
its rollouts; teardown stops each running job; a deployment without the plane refuses a
serverless run with the fix."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from domain.backends import (
    EvaluationUnsupported,
    Phase,
    RewardFleet,
    RunContext,
    worker_environment,
)
from domain.episodes import Episode, EvaluationStage
from domain.run_queues import create_run_queues
from domain.run_state import RegisteredRun
from domain.serverless_job import ServerlessRefused, job_name
from lambdas.clients import Clients
from lambdas.pipeline.composition import at_the_boundary
from lambdas.pipeline.compute import ComputeSteps
from lambdas.pipeline.dependencies import Compute, Dependencies
from lambdas.pipeline.job_records import held_out_records
from lambdas.pipeline.serverless_training import ManagedJobSettings, ServerlessTrainingCluster
from lambdas.pipeline.settings import PipelineSettings
from lambdas.pipeline.training_metrics import KeptMetrics
from lambdas.pipeline.training_planes import TrainingPlanes
from lambdas.router.conversations import ConversationStore, create_table
from reward_envs.worker.settings import WorkerSettings
from tests.pipeline.test_training_planes import Recording
from training_configs.schema import load_training_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordle" / "serverless.yaml"
BUCKET, RUN = "mtrl-data", "wordle-0123456789"
SETTINGS = ManagedJobSettings.model_validate({
    "NAME_PREFIX": "mtrl", "AWS_REGION": "us-east-1", "ACCOUNT_ID": "123456789012",
    "SERVERLESS_JOB_ROLE_ARN": "arn:aws:iam::123456789012:role/mtrl-agent-rft-job",
    "AGENT_FUNCTION_ARN": "arn:aws:lambda:us-east-1:123456789012:function:mtrl-agent-rft",
    "DATA_KEY_ARN": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    "CONVERSATIONS_TABLE": "conversations",
})  # fmt: skip
JOB = job_name("mtrl", RUN)
JOB_ARN = f"arn:aws:sagemaker:us-east-1:123456789012:job/AgentRFT/{JOB}"
HUB_ARN = "arn:aws:sagemaker:us-east-1:aws:hub-content/SageMakerPublicHub/Model/nova-textgeneration-lite-v2/1.2.0"
WHEN = datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC)
KEYS = {"JobName": JOB, "JobCategory": "AgentRFT"}


def described(status: str, secondary: str = "Training", **more: Any) -> dict[str, Any]:
    return {
        "JobName": JOB, "JobArn": JOB_ARN, "RoleArn": SETTINGS.job_role_arn,
        "JobCategory": "AgentRFT", "JobConfigSchemaVersion": "1.0.0", "CreationTime": WHEN,
        "LastModifiedTime": WHEN, "JobStatus": status, "SecondaryStatus": secondary,
        "SecondaryStatusTransitions": [], **more,
    }  # fmt: skip


@pytest.fixture
def run(aws: None) -> RunContext:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    records = "".join(
        json.dumps({"id": f"w-{i}", "metadata": {"prompt": "Play.", "answer": "crane"}}) + "\n"
        for i in range(200)
    )
    s3.put_object(Bucket=BUCKET, Key="training-data/wordle.jsonl", Body=records.encode())
    return RunContext(
        run_id=RUN, queues={}, router_url=None, run_token="", bucket=BUCKET,
        dataset_key="training-data/wordle.jsonl", dataset_version=None,
        output_prefix=f"runs/{RUN}/", config=load_training_config(EXAMPLE),
    )  # fmt: skip


@pytest.fixture
def plane(run: RunContext) -> Iterator[tuple[ServerlessTrainingCluster, Stubber]]:
    sagemaker = boto3.client("sagemaker")
    with Stubber(sagemaker) as stubber:
        yield (
            ServerlessTrainingCluster(
                SETTINGS,
                sagemaker=sagemaker,
                s3=boto3.client("s3"),
                store=store(),
            ),
            stubber,
        )
        stubber.assert_no_pending_responses()


def store() -> ConversationStore:
    """The router's table, empty: no rollout reported yet."""
    db = boto3.client("dynamodb")
    create_table(db, SETTINGS.conversations_table)
    return ConversationStore(db, SETTINGS.conversations_table)


def not_found(stubber: Stubber, operation: str) -> None:
    stubber.add_client_error(operation, service_error_code="ResourceNotFound", http_status_code=404)


def hub_model(stubber: Stubber) -> None:
    """DescribeHubContent's answer for the run's model: its HUB_ARN."""
    stubber.add_response(
        "describe_hub_content",
        {"HubContentName": "nova-textgeneration-lite-v2", "HubContentArn": HUB_ARN,
         "HubContentVersion": "1.2.0", "HubContentType": "Model", "DocumentSchemaVersion": "2.0.0",
         "HubName": "SageMakerPublicHub",
         "HubArn": "arn:aws:sagemaker:us-east-1:aws:hub/SageMakerPublicHub",
         "HubContentDocument": "{}", "HubContentStatus": "Available", "CreationTime": WHEN},
        {"HubName": "SageMakerPublicHub", "HubContentType": "Model",
         "HubContentName": "nova-textgeneration-lite-v2"},
    )  # fmt: skip


def ids_at(uri: str) -> set[str]:
    """The ids of the records written at `uri` of the run's bucket."""
    body = boto3.client("s3").get_object(Bucket=BUCKET, Key=uri.removeprefix(f"s3://{BUCKET}/"))
    return {json.loads(line)["id"] for line in body["Body"].read().splitlines()}


def held_out(run: RunContext) -> set[str]:
    """The records the config holds out of the run's dataset (domain/evaluation.py)."""
    return {r.id for r in held_out_records(boto3.client("s3"), run)}


def test_a_run_submits_its_job_once_with_its_records_and_the_document(
    plane: tuple[ServerlessTrainingCluster, Stubber], run: RunContext
) -> None:
    cluster, stubber = plane
    sent: dict[str, Any] = {}
    cluster.sagemaker.meta.events.register(
        "provide-client-params.sagemaker.CreateJob", lambda params, **_: sent.update(params)
    )
    not_found(stubber, "describe_job")
    hub_model(stubber)
    stubber.add_response("create_job", {"JobArn": JOB_ARN}, {**KEYS, "RoleArn": SETTINGS.job_role_arn,
                         "JobConfigSchemaVersion": "1.0.0", "JobConfigDocument": ANY, "Tags": ANY})  # fmt: skip
    assert cluster.submit(run) == JOB_ARN
    document = json.loads(sent["JobConfigDocument"])
    assert document["TrainingConfig"]["BaseModelArn"] == HUB_ARN
    channels = {
        c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"]
        for c in document["InputDataConfig"]
    }
    # The held-out records are not trained on, and not played in training either (no
    # validation channel): AWS's evaluation jobs play them.
    assert channels == {"train": f"s3://{BUCKET}/runs/{RUN}/data/training.jsonl"}
    trained = ids_at(channels["train"])
    assert trained and not trained & held_out(run) and len(trained | held_out(run)) == 200
    assert document["OutputDataConfig"] == {"S3OutputPath": f"s3://{BUCKET}/runs/{RUN}/",
                                            "KmsKeyArn": SETTINGS.data_key_arn}  # fmt: skip
    assert {"Key": "mtrl-run", "Value": RUN} in sent["Tags"]
    # Submitted again (a retried step): the run's job is its job, nothing is created.
    stubber.add_response("describe_job", described("InProgress", "Starting"), KEYS)
    assert cluster.submit(run) == JOB_ARN


@pytest.mark.parametrize(
    ("status", "secondary", "more", "phase", "reason"),
    [
        ("InProgress", "Pending", {}, Phase.PENDING, "Pending"),
        ("InProgress", "Starting", {}, Phase.PENDING, "Starting"),
        ("InProgress", "Training", {}, Phase.RUNNING, "Training"),
        ("Completed", "Completed", {}, Phase.SUCCEEDED, ""),
        ("Failed", "Failed", {"FailureReason": "ClientError: no agent"}, Phase.FAILED, "ClientError: no agent"),
        ("Stopped", "Stopped", {}, Phase.FAILED, "the job is Stopped"),
    ],
)  # fmt: skip
def test_describe_jobs_status_is_the_runs_phase(
    plane: tuple[ServerlessTrainingCluster, Stubber], run: RunContext,
    status: str, secondary: str, more: dict[str, Any], phase: Phase, reason: str,
) -> None:  # fmt: skip
    cluster, stubber = plane
    stubber.add_response("describe_job", described(status, secondary, **more), KEYS)
    found = cluster.status(run)
    assert (found.phase, found.reason) == (phase, reason)


def test_the_runs_progress_is_the_reward_curve_of_its_workers_reports(
    plane: tuple[ServerlessTrainingCluster, Stubber], run: RunContext
) -> None:
    """The managed job writes no metrics of ours (its own go to MLflow): the step is the run's
    reward curve, made from the rollout reports its workers sent the router, its last short
    window once the job ended."""
    cluster, stubber = plane
    stubber.add_response("describe_job", described("InProgress"), KEYS)
    status = cluster.status(run)
    assert (status.phase, status.step) == (Phase.RUNNING, None)  # no rollout reported yet
    size = run.training.global_batch_size
    for index in range(2 * size + 3):
        cluster.curve.store.record_report(
            run.run_id, f"m{index}", episode=Episode(
                record_id="r", sample_id=f"r_{index}", stop_reason="end_of_conversation",
                score=index % 2, success=index % 2 == 1,
            ), stage=None, now=float(index),
        )  # fmt: skip
    stubber.add_response("describe_job", described("InProgress"), KEYS)
    assert cluster.status(run).step == 2
    metrics = boto3.client("s3").get_object(Bucket=BUCKET, Key=f"runs/{RUN}/metrics.jsonl")
    first, _ = (json.loads(line) for line in metrics["Body"].read().splitlines())
    assert (first["rollouts"], first["mean_reward"], first["source"]) == (
        size, 0.5, "rollout_reports",
    )  # fmt: skip
    stubber.add_response("describe_job", described("Completed", "Completed"), KEYS)
    status = cluster.status(run)
    assert (status.phase, status.step) == (Phase.SUCCEEDED, 3)


def test_the_runs_model_is_the_package_its_job_registered(
    plane: tuple[ServerlessTrainingCluster, Stubber], run: RunContext
) -> None:
    """DescribeJob's ServiceOutput names it once the job completed; before, or without a job,
    there is none (Collect then registers nothing of its own: no checkpoint of ours)."""
    cluster, stubber = plane
    package = "arn:aws:sagemaker:us-east-1:123456789012:model-package/mtrl-models/2"
    document = {"ServiceOutput": {"OutputModelPackageArn": package}}
    stubber.add_response("describe_job", described("InProgress"), KEYS)
    assert cluster.managed_job_output(run).output_model_package_arn is None
    stubber.add_response(
        "describe_job",
        described("Completed", "Completed", JobConfigDocument=json.dumps(document)),
        KEYS,
    )
    assert cluster.managed_job_output(run).output_model_package_arn == package
    not_found(stubber, "describe_job")
    assert cluster.managed_job_output(run) is None


def test_teardown_stops_each_running_job_and_leaves_an_ended_or_missing_one(
    plane: tuple[ServerlessTrainingCluster, Stubber], run: RunContext
) -> None:
    """The training job and both evaluations: a running one is stopped, one that ended or was
    never created is left; each one there is counted."""
    cluster, stubber = plane
    stubber.add_response("describe_job", described("Completed", "Completed"), KEYS)
    baseline = evaluation_keys(EvaluationStage.BASELINE)
    stubber.add_response("describe_job", described_evaluation("Completed", baseline), baseline)
    final = evaluation_keys(EvaluationStage.FINAL)
    stubber.add_response("describe_job", described_evaluation("InProgress", final), final)
    stubber.add_response("stop_job", {}, final)
    assert cluster.delete(run) == 3
    stubber.add_response("describe_job", described("InProgress"), KEYS)
    stubber.add_response("stop_job", {}, KEYS)
    for _ in EvaluationStage:
        not_found(stubber, "describe_job")
    assert cluster.delete(run) == 1
    for _ in range(3):
        not_found(stubber, "describe_job")
    assert cluster.delete(run) == 0
    assert cluster.nodes_ready(run) == 0 and cluster.release_idle() is False


def evaluation_keys(stage: EvaluationStage) -> dict[str, str]:
    return {"JobName": job_name("mtrl", RUN, stage), "JobCategory": "AgentRFTEvaluation"}


def evaluation_arn(stage: EvaluationStage) -> str:
    return f"arn:aws:sagemaker:us-east-1:123456789012:job/AgentRFTEvaluation/{job_name('mtrl', RUN, stage)}"


def described_evaluation(status: str, keys: dict[str, str], **more: Any) -> dict[str, Any]:
    stage = EvaluationStage(keys["JobName"].rpartition("-")[2])
    return described(status, status, **more) | keys | {"JobArn": evaluation_arn(stage)}


PACKAGE = "arn:aws:sagemaker:us-east-1:123456789012:model-package/mtrl-models/2"


def test_each_evaluation_is_awss_evaluation_job_of_the_base_or_the_trained_model_once(
    plane: tuple[ServerlessTrainingCluster, Stubber], run: RunContext
) -> None:
    """Baseline: the hub's base model; final: the package the training job registered. Both on
    the run's held-out records (the `evaluation` channel), with the run's tags and the job role;
    a retried step finds the job it created."""
    cluster, stubber = plane
    sent: list[dict[str, Any]] = []
    cluster.sagemaker.meta.events.register(
        "provide-client-params.sagemaker.CreateJob", lambda params, **_: sent.append(params)
    )
    documents = {}
    for stage in EvaluationStage:
        keys = evaluation_keys(stage)
        not_found(stubber, "describe_job")
        if stage is EvaluationStage.FINAL:
            trained = described("Completed", "Completed", JobConfigDocument=json.dumps(
                {"ServiceOutput": {"OutputModelPackageArn": PACKAGE}}))  # fmt: skip
            stubber.add_response("describe_job", trained, KEYS)
        hub_model(stubber)
        stubber.add_response("create_job", {"JobArn": evaluation_arn(stage)}, {**keys,
                             "RoleArn": SETTINGS.job_role_arn, "JobConfigSchemaVersion": "1.0.0",
                             "JobConfigDocument": ANY, "Tags": ANY})  # fmt: skip
        assert cluster.submit_evaluation(run, stage=stage) == evaluation_arn(stage)
        documents[stage] = json.loads(sent[-1]["JobConfigDocument"])
        assert {"Key": "mtrl-run", "Value": RUN} in sent[-1]["Tags"]
        # Retried: the run's evaluation is the one it has.
        stubber.add_response("describe_job", described_evaluation("InProgress", keys), keys)
        assert cluster.submit_evaluation(run, stage=stage) == evaluation_arn(stage)
    baseline, final = documents[EvaluationStage.BASELINE], documents[EvaluationStage.FINAL]
    assert (
        baseline["EvaluationConfig"]["BaseModelArn"]
        == HUB_ARN
        == final["EvaluationConfig"]["BaseModelArn"]
    )
    assert "ModelPackageConfig" not in baseline
    assert final["ModelPackageConfig"] == {"InputModelPackageArn": PACKAGE}
    (channel,) = final["InputDataConfig"]
    assert channel["ChannelName"] == "evaluation"
    assert ids_at(channel["DataSource"]["S3DataSource"]["S3Uri"]) == held_out(run)
    assert baseline["EvaluationConfig"]["HyperParameters"]["eval_group_size"] == str(
        run.training.eval_samples
    )
    assert (
        final["OutputDataConfig"]["S3OutputPath"] == f"s3://{BUCKET}/runs/{RUN}/evaluation/final/"
    )
    assert final["StoppingCondition"] == {"MaxRuntimeInSeconds": 12 * 3600}  # deadline_hours


def test_a_trained_model_the_job_registered_no_package_for_cannot_be_evaluated(
    plane: tuple[ServerlessTrainingCluster, Stubber], run: RunContext
) -> None:
    cluster, stubber = plane
    not_found(stubber, "describe_job")
    stubber.add_response("describe_job", described("Completed", "Completed"), KEYS)
    with pytest.raises(EvaluationUnsupported, match="registered no trained model package"):
        cluster.submit_evaluation(run, stage=EvaluationStage.FINAL)


def test_an_evaluations_episodes_are_the_reports_of_its_rollouts_once_it_completed(
    plane: tuple[ServerlessTrainingCluster, Stubber], run: RunContext
) -> None:
    """Its phase's reports only (training's are not its); none at all fails it with why."""
    cluster, stubber = plane
    keys = evaluation_keys(EvaluationStage.BASELINE)
    stubber.add_response("describe_job", described_evaluation("InProgress", keys), keys)
    assert cluster.evaluation_status(run, stage=EvaluationStage.BASELINE).phase is Phase.RUNNING
    stubber.add_response("describe_job", described_evaluation("Completed", keys), keys)
    failed = cluster.evaluation_status(run, stage=EvaluationStage.BASELINE)
    assert failed.phase is Phase.FAILED
    assert "no rollout of it reached the run's reward workers (the agent Lambda" in failed.reason
    for index, stage in enumerate([EvaluationStage.BASELINE, None, EvaluationStage.BASELINE]):
        cluster.store.record_report(
            RUN, f"m{index}", episode=Episode(
                record_id=f"w-{index}", sample_id=f"w-{index}_0", stop_reason="end_of_conversation",
                score=1.0, success=True,
            ), stage=stage, now=float(index),
        )  # fmt: skip
    stubber.add_response("describe_job", described_evaluation("Completed", keys), keys)
    assert cluster.evaluation_status(run, stage=EvaluationStage.BASELINE).phase is Phase.SUCCEEDED
    written = boto3.client("s3").get_object(
        Bucket=BUCKET, Key=f"runs/{RUN}/evaluation/baseline.jsonl"
    )
    assert [json.loads(line)["record_id"] for line in written["Body"].read().splitlines()] == [
        "w-0",
        "w-2",
    ]


def test_a_serverless_run_takes_the_serverless_plane_where_the_deployment_has_one(
    run: RunContext,
) -> None:
    standard, nova, serverless = Recording("standard"), Recording("nova"), Recording("serverless")
    TrainingPlanes(standard=standard, nova=nova, serverless=serverless).submit(run)
    assert [plane.name for plane in (standard, nova, serverless) if plane.asked] == ["serverless"]
    with pytest.raises(ServerlessRefused, match="this deployment has no serverless plane"):
        TrainingPlanes(standard=standard, nova=nova).submit(run)


class Fleet(RewardFleet):
    """A reward fleet that records the workers' settings it was asked to start with."""

    def __init__(self) -> None:
        self.environments: list[dict[str, str]] = []

    def start(self, run: RunContext, *, workers: int) -> list[str]:
        self.environments.append(worker_environment(run))
        return [f"worker-{n}" for n in range(workers)]

    def healthy(self, run: RunContext) -> int:
        return 0

    def stop(self, run: RunContext) -> int:
        return 0


def test_a_serverless_runs_workers_start_in_agent_mode_and_its_job_is_the_runs(
    run: RunContext,
) -> None:
    """Start workers: the run's job recorded (the agent Lambda finds its run by it), its workers
    told to play the job's requests and report to its runtime service."""
    db, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    create_table(db, "conversations")
    queues = create_run_queues(sqs, prefix="mtrl", run_id=RUN)
    config = run.training.model_dump(mode="json")
    registered = RegisteredRun(run_id=RUN, poll_seconds=60, created=True, config=config,
                               cost_per_hour=1.0, deadline_at=3600.0)  # fmt: skip
    state = {
        "run": registered.model_dump(mode="json"), "bucket": BUCKET, "key": run.dataset_key,
        "resources": {"run_id": RUN, "queues": queues.urls(), "alarms": []},
    }  # fmt: skip
    fleet = Fleet()
    settings = PipelineSettings(NAME_PREFIX="mtrl", RUNS_TABLE="runs",
                                CONVERSATIONS_TABLE="conversations", CONSUMER_FUNCTION="consumer",
                                ROLLOUT_LAMBDA_ARN="arn:aws:lambda:us-east-1:1:function:r")  # fmt: skip
    steps = ComputeSteps(Dependencies(
        settings=settings, clients=Clients(boto3.Session()),
        compute=Compute(fleet=lambda: fleet, cluster=lambda: pytest.fail("no plane asked")),
        training_metrics=KeptMetrics(), clock=lambda: 0.0,
    ))  # fmt: skip
    start_workers = at_the_boundary(steps.start_workers)  # as the state machine invokes it
    assert start_workers(state) == {"workers": run.training.reward_workers}
    assert ConversationStore(db, "conversations").run_of_job(JOB, now=0.0) == RUN
    (environment,) = fleet.environments
    worker = WorkerSettings.model_validate(
        {key.removeprefix("MTRL_").lower(): value for key, value in environment.items()}
    )
    assert (worker.agent_rft, worker.max_length) == (True, run.training.max_length)
    hyperpod = load_training_config("rft_multiturn_lora")
    assert "MTRL_AGENT_RFT" not in worker_environment(
        replace(run, config=hyperpod, queues=queues.urls())
    )
