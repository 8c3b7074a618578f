"""Compute steps: the monitor's verdicts (deadline, budget, stall, phases) and the run summary."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from pydantic import ValidationError

from domain.backends import EvaluationUnsupported, JobStatus, Phase, RunContext, TrainingCluster
from domain.checkpoints import CheckpointManifest, SavedCheckpoint
from domain.episodes import Episode, EvaluationStage
from domain.health import TRAINING_METRICS_NAMESPACE
from domain.run_queues import KINDS, PURGE_SECONDS, QueueKind, create_run_queues
from domain.run_state import RegisteredRun
from domain.runs import RunRecord, RunStore
from domain.serverless_job import ServiceOutput
from lambdas.clients import Clients
from lambdas.pipeline.composition import at_the_boundary
from lambdas.pipeline.compute import ComputeSteps, EvaluationFailed, RunPastDeadline
from lambdas.pipeline.dependencies import Compute, Dependencies
from lambdas.pipeline.settings import PipelineSettings
from lambdas.pipeline.steps import STEP
from lambdas.pipeline.training_metrics import EmbeddedMetrics, KeptMetrics
from lambdas.router.conversations import ConversationStore, create_table
from tests.aws import create_runs_table
from training_configs.schema import load_training_config


class Scripted(TrainingCluster):
    def __init__(self, status: JobStatus, *, managed: ServiceOutput | None = None) -> None:
        """`managed`: what a managed job reported of itself (its package, the tokens billed)."""
        self.current, self.managed = status, managed

    def scale_up(self, run: RunContext, *, instances: int) -> None: ...
    def nodes_ready(self, run: RunContext) -> int:
        return 0

    def submit(self, run: RunContext) -> str:
        return "job"

    def status(self, run: RunContext) -> JobStatus:
        return self.current

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        return f"evaluation-{stage}"

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        return self.current

    def delete(self, run: RunContext) -> int:
        return 0

    def managed_job_output(self, run: RunContext) -> ServiceOutput | None:
        return self.managed

    def scale_down(self, run: RunContext) -> None: ...

    def release_idle(self, *, immediately: bool = False) -> bool:
        return False


CONFIG = (
    load_training_config("rft_multiturn_lora")
    .model_copy(update={"rollout_timeout_seconds": 60, "budget_usd": 100.0})
    .model_dump(mode="json")
)

# Register's result for run "r" (deadline at 3600 s, $60/h).
REGISTERED = RegisteredRun(
    run_id="r", poll_seconds=60, created=True, config=CONFIG, cost_per_hour=60.0, deadline_at=3600.0
).model_dump(mode="json")

SETTINGS = PipelineSettings(
    NAME_PREFIX="nova-mtrl",
    RUNS_TABLE="runs",
    CONVERSATIONS_TABLE="conversations",
    CONSUMER_FUNCTION="consumer",
    ROLLOUT_LAMBDA_ARN="arn:aws:lambda:us-east-1:123456789012:function:rollout-forwarder",
)


EXECUTION = "arn:aws:states:us-east-1:123456789012:execution:nova-mtrl-pipeline:r"


def collect(compute: SimpleNamespace, state: dict) -> dict:
    """Collect as the state machine calls it: the state, and the execution's ARN."""
    return compute.collect({"state": state, "execution_arn": EXECUTION})


# A job that ended, having registered no model of its own (any plane but the serverless one).
ENDED = Scripted(JobStatus(Phase.SUCCEEDED))


def steps(
    cluster: TrainingCluster | None = None,
    *,
    now: float = 0.0,
    settings: PipelineSettings = SETTINGS,
    published: KeptMetrics | None = None,
) -> SimpleNamespace:
    """The compute steps at `now`, with `cluster` as the training plane (and no reward fleet),
    as the state machine invokes them (events in, JSON data out); Monitor publishes to
    `published`."""
    unused = lambda: pytest.fail("this step needs no other plane")  # noqa: E731
    compute = Compute(fleet=unused, cluster=(lambda: cluster) if cluster else unused)
    made = ComputeSteps(
        Dependencies(
            settings=settings,
            clients=Clients(boto3.Session()),
            compute=compute,
            training_metrics=published or KeptMetrics(),
            clock=lambda: now,
        )
    )
    return SimpleNamespace(
        **{name: at_the_boundary(getattr(made, name)) for name in STEP if hasattr(made, name)}
    )


@pytest.fixture
def state(aws: None) -> dict:
    db = boto3.client("dynamodb")
    create_runs_table(db, "runs")
    RunStore(db, "runs").register(
        RunRecord(
            run_id="r",
            bucket="b",
            key="training-data/x.jsonl",
            config_name="c",
            created_at=0.0,
            updated_at=0.0,
            deadline_at=3600.0,
            cost_per_hour=60.0,
        )
    )
    boto3.client("s3").create_bucket(Bucket="data-b")
    return {
        "run": REGISTERED,
        "bucket": "data-b",
        "key": "training-data/x.jsonl",
    }


def test_monitor_reports_the_job_phase(state: dict) -> None:
    cluster = Scripted(JobStatus("failed", reason="OOMKilled"))
    assert steps(cluster, now=60.0).monitor(state)["phase"] == "failed"


def test_monitor_stops_runs_past_deadline_or_over_budget(state: dict) -> None:
    cluster = Scripted(JobStatus("running", step=3))
    assert steps(cluster, now=4000.0).monitor(state)["phase"] == "past_deadline"
    # 60 $/h: $100 is spent after 6,000 s; the deadline comes first unless it is later.
    RunStore(boto3.client("dynamodb"), "runs").update("r", now=1.0, deadline_at=10_000.0)
    verdict = steps(cluster, now=7000.0).monitor(state)
    assert verdict["phase"] == "over_budget" and "$117" in verdict["reason"]


def test_monitor_calls_a_run_without_progress_stalled(state: dict) -> None:
    monitor = steps(Scripted(JobStatus("running", step=7)), now=100.0).monitor
    verdicts = []
    for _ in range(4):
        verdict = monitor(state)
        state["job"] = verdict
        verdicts.append(verdict["phase"])
    assert verdicts == ["running", "running", "running", "stalled"]
    assert "no training progress past step 7" in state["job"]["reason"]


def metrics(*lines: dict) -> None:
    """The run's metrics object as its trainer writes it, a line per step."""
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    boto3.client("s3").put_object(Bucket="data-b", Key="runs/r/metrics.jsonl", Body=body)


def test_monitor_stops_a_run_a_health_rule_says_is_dead(state: dict) -> None:
    """The default rules: no learning signal in any group for 10 steps stops the run (the state
    machine then fails it, its reason as the error, and tears it down)."""
    flat = [{"step": s, "zero_variance_groups": 1.0, "rollouts_asked": 32, "failed_rollouts": 0}
            for s in range(1, 11)]  # fmt: skip
    monitor = steps(Scripted(JobStatus("running", step=10)), now=100.0).monitor
    metrics(*flat[:9])
    assert monitor(state)["phase"] == "running"  # nine steps: not yet
    metrics(*flat)
    verdict = monitor(state)
    assert verdict["phase"] == "unhealthy"
    assert verdict["reason"].startswith(
        "run health: 100% of the GRPO groups had no reward variance"
    )
    assert "steps 1-10" in verdict["reason"]
    done = steps(Scripted(JobStatus("succeeded", step=10)), now=100.0).monitor(state)
    assert done["phase"] == "succeeded"  # a job that finished is not stopped after the fact


def test_monitor_fails_a_job_that_succeeded_without_one_scored_rollout(state: dict) -> None:
    """Two steps of failed rollouts, too short for the health rules' windows: the job's success
    is the run's failure (the state machine then fails it with this reason)."""
    failed = {"rollouts_asked": 16, "failed_rollouts": 16, "env_error_rollouts": 16}
    metrics({"step": 1, **failed}, {"step": 2, **failed})
    monitor = steps(Scripted(JobStatus("succeeded", step=2)), now=100.0).monitor
    verdict = monitor(state)
    assert verdict["phase"] == "failed"
    assert verdict["reason"].startswith("the job ended without one scored rollout: all 32 failed")
    metrics({"step": 1, **failed}, {"step": 2, **failed, "failed_rollouts": 15})
    assert monitor(state)["phase"] == "succeeded"


def test_monitor_carries_health_warnings_and_goes_on(state: dict) -> None:
    flaky = {
        "rollouts_asked": 32,
        "failed_rollouts": 4,
        "env_error_rollouts": 4,
        "timeout_rollouts": 0,
    }
    metrics(*({"step": s, "zero_variance_groups": 0.0, **flaky} for s in (1, 2, 3)))
    verdict = steps(Scripted(JobStatus("running", step=3)), now=100.0).monitor(state)
    assert verdict["phase"] == "running"
    (warning,) = verdict["health"]
    assert "12% of the rollouts ended in an environment error on steps 1-3" in warning
    failing = {**flaky, "failed_rollouts": 16, "env_error_rollouts": 16}
    metrics(*({"step": s, "zero_variance_groups": 0.0, **failing} for s in (1, 2, 3)))
    stopped = steps(Scripted(JobStatus("running", step=3)), now=100.0).monitor(state)
    assert stopped["phase"] == "unhealthy" and "50% of the rollouts failed" in stopped["reason"]


def test_monitor_publishes_each_new_step_once_for_the_dashboard(state: dict) -> None:
    kept = KeptMetrics()
    monitor = steps(Scripted(JobStatus("running", step=2)), now=100.0, published=kept).monitor
    line = {"zero_variance_groups": 0.25, "rollouts_asked": 8, "failed_rollouts": 2,
            "env_error_rollouts": 1, "timeout_rollouts": 1, "truncated_rollouts": 0,
            "mean_reward": 0.5, "win_rate": 0.125}  # fmt: skip
    metrics(*({"step": s, **line} for s in (1, 2)))
    first = monitor(state)
    assert first["published_step"] == 2
    assert [(run, step) for run, step, _ in kept.published] == [("r", 1), ("r", 2)]
    assert kept.published[0][2] == {
        "MeanReward": 0.5,
        "SuccessRate": 0.125,
        "ZeroVarianceGroups": 0.25,
        "FailedRolloutRate": 0.25,
        "EnvErrorRate": 0.125,
        "TimeoutRate": 0.125,
        "TruncationRate": 0.0,
    }  # fmt: skip  (RewardHacking: too few steps to tell)
    # The next poll publishes only what is new; a step rewritten by a resume is not again.
    metrics(*({"step": s, **line} for s in (1, 2, 2, 3)))
    second = monitor({**state, "job": first})
    assert second["published_step"] == 3 and [s for _, s, _ in kept.published] == [1, 2, 3]
    assert monitor({**state, "job": second})["published_step"] == 3 and len(kept.published) == 3


def test_the_deployed_publisher_writes_embedded_metric_format(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CloudWatch's embedded metric format (CloudWatch User Guide, "Specification: Embedded
    metric format"): the namespace, one dimension set, each figure a metric of the document."""
    EmbeddedMetrics("nova-mtrl").publish("wordle-0a1b2c3d4e", 7, {"MeanReward": 0.5})
    (document,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    (directive,) = document["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == TRAINING_METRICS_NAMESPACE
    assert directive["Dimensions"] == [["deployment", "run_id", "service"]]
    assert directive["Metrics"] == [{"Name": "MeanReward", "Unit": "None"}]
    assert (document["deployment"], document["run_id"], document["step"]) == (
        "nova-mtrl", "wordle-0a1b2c3d4e", 7,
    )  # fmt: skip
    assert document["MeanReward"] == [0.5]
    EmbeddedMetrics("nova-mtrl").publish("r", 1, {})  # nothing measured: no document
    assert capsys.readouterr().out == ""


def test_collect_writes_the_run_summary(aws: None) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bucket-1")
    s3.put_object(Bucket="bucket-1", Key="runs/r/metrics.jsonl", Body=b"{}\n")
    result = collect(
        steps(ENDED),
        {
            "bucket": "bucket-1",
            "key": "training-data/x.jsonl",
            "run": REGISTERED,
            "job": {"phase": "succeeded", "step": 9},
        },
    )
    summary = json.loads(s3.get_object(Bucket="bucket-1", Key="runs/r/summary.json")["Body"].read())
    assert result == {
        "results": "s3://bucket-1/runs/r/", "objects": 2, "evaluation": None, "caution": None,
    }  # fmt: skip
    assert summary["outputs"] == ["evaluation.json", "metrics.jsonl"]
    assert summary["job"]["step"] == 9 and summary["checkpoints"] == []


def _episodes(passed: list[int]) -> bytes:
    """One episode per flag, two per record; a reward of 0.1, or 0.9 when it passed."""
    return b"".join(
        Episode(
            record_id=f"r{i // 2}",
            sample_id=f"eval-r{i // 2}_{i}",
            stop_reason="end_of_conversation",
            score=0.9 if flag else 0.1,
            success=bool(flag),
            turns=3,
        )
        .model_dump_json()
        .encode()
        + b"\n"
        for i, flag in enumerate(passed)
    )


def test_an_evaluation_is_skipped_when_nothing_is_held_out_or_the_plane_cannot(state: dict) -> None:
    cluster = Scripted(JobStatus("running"))
    event = {"stage": "baseline", "state": state}
    assert steps(cluster).start_evaluation(event) == {
        "stage": "baseline", "job": "evaluation-baseline", "skipped": None, "ready": False,
        "phase": None, "n": None, "mean_reward": None, "pass_at_1": None,
    }  # fmt: skip
    held_nothing = {**state, "run": {**REGISTERED, "config": {**CONFIG, "eval_fraction": 0.0}}}
    skipped = steps(cluster).start_evaluation({"stage": "final", "state": held_nothing})
    assert skipped["ready"] and "holds no records out" in skipped["skipped"]

    class CannotEvaluate(Scripted):
        def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
            raise EvaluationUnsupported("not on this plane")

    unsupported = steps(CannotEvaluate(JobStatus("running"))).start_evaluation(event)
    assert unsupported["ready"] and unsupported["skipped"] == "not on this plane"


def test_an_evaluation_is_polled_until_it_ends_then_its_figures_are_read(state: dict) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bucket-1")
    state["bucket"] = "bucket-1"
    state["evaluations"] = {"baseline": {"stage": "baseline", "job": "j"}}
    event = {"stage": "baseline", "state": state}
    running = steps(Scripted(JobStatus("running")), now=60.0).evaluation_status(event)
    assert running["ready"] is False and running["phase"] == "running" and running["job"] == "j"
    s3.put_object(
        Bucket="bucket-1", Key="runs/r/evaluation/baseline.jsonl", Body=_episodes([1, 0, 0, 0])
    )
    done = steps(Scripted(JobStatus("succeeded")), now=60.0).evaluation_status(event)
    assert done["ready"] and (done["n"], done["pass_at_1"]) == (4, 0.25)
    assert done["mean_reward"] == pytest.approx(0.3)
    with pytest.raises(EvaluationFailed, match="baseline evaluation ended failed: OOMKilled"):
        steps(Scripted(JobStatus("failed", "OOMKilled")), now=60.0).evaluation_status(event)
    with pytest.raises(RunPastDeadline):
        steps(Scripted(JobStatus("running")), now=4000.0).evaluation_status(event)


def test_a_baseline_evaluation_that_scored_nothing_stops_the_run_before_training(
    state: dict,
) -> None:
    """Every held-out rollout of the starting model failed (the environment errs, or times
    out): the run fails there, saying how they ended, instead of training on nothing. The final
    evaluation's figures are reported as they are."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bucket-1")
    state |= {"bucket": "bucket-1", "evaluations": {"baseline": {"stage": "baseline", "job": "j"}}}
    failed = [
        Episode(record_id=f"r{i}", sample_id=f"eval-r{i}_0", stop_reason=reason, error=error)
        for i, (reason, error) in enumerate(
            [("env_error", None), ("env_error", "step 1: KeyError: 'answer'"), ("timeout", "late")]
        )
    ]
    body = b"".join(e.model_dump_json().encode() + b"\n" for e in failed)
    s3.put_object(Bucket="bucket-1", Key="runs/r/evaluation/baseline.jsonl", Body=body)
    done = steps(Scripted(JobStatus("succeeded")), now=60.0)
    with pytest.raises(EvaluationFailed) as stopped:
        done.evaluation_status({"stage": "baseline", "state": state})
    assert str(stopped.value) == (
        "the baseline evaluation scored none of its 3 rollouts (2 env_error, 1 timeout): "
        "training on this environment as it runs would learn nothing; `mtrl env check` it, or "
        "see the reward workers' logs; the first failure: step 1: KeyError: 'answer'"
    )
    s3.put_object(Bucket="bucket-1", Key="runs/r/evaluation/final.jsonl", Body=body)
    state["evaluations"]["final"] = {"stage": "final", "job": "k"}
    assert done.evaluation_status({"stage": "final", "state": state})["n"] == 3


def test_collect_writes_the_evaluation_report_and_its_headline(state: dict) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bucket-1")
    state["bucket"] = "bucket-1"
    state["evaluations"] = {
        stage: {"stage": stage, "job": "j", "ready": True} for stage in ("baseline", "final")
    }
    s3.put_object(
        Bucket="bucket-1", Key="runs/r/evaluation/baseline.jsonl", Body=_episodes([0, 0, 1, 0])
    )
    s3.put_object(
        Bucket="bucket-1", Key="runs/r/evaluation/final.jsonl", Body=_episodes([1, 1, 1, 0])
    )
    result = collect(steps(ENDED), state)
    assert result["evaluation"].startswith("pass@1 0.25 → 0.75 (+0.50, 95% CI ")
    report = json.loads(
        s3.get_object(Bucket="bucket-1", Key="runs/r/evaluation.json")["Body"].read()
    )
    assert (report["baseline"]["n"], report["final"]["pass_at_1"]) == (4, 0.75)
    assert report["delta"]["mean_reward"]["delta"] == pytest.approx(0.4)
    summary = json.loads(s3.get_object(Bucket="bucket-1", Key="runs/r/summary.json")["Body"].read())
    assert summary["evaluation"] == report


def test_collect_records_the_checkpoints_a_nova_job_recorded(aws: None) -> None:
    """`<output>/<job>/manifest.json` with `checkpoint_s3_bucket`, as the Forge SDK reads it; a
    manifest elsewhere or unreadable is not taken for one (or has no location)."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bucket-1")
    for key, body in (
        ("runs/r/job-abcde/manifest.json", b'{"checkpoint_s3_bucket": "s3://escrow/job-abcde"}'),
        ("runs/r/job-fghij/manifest.json", b"not json"),
        ("runs/r/manifest.json", b"{}"),
        ("runs/r/job-abcde/deeper/manifest.json", b"{}"),
    ):
        s3.put_object(Bucket="bucket-1", Key=key, Body=body)
    collect(steps(ENDED), {"bucket": "bucket-1", "key": "training-data/x.jsonl", "run": REGISTERED})
    summary = json.loads(s3.get_object(Bucket="bucket-1", Key="runs/r/summary.json")["Body"].read())
    assert summary["checkpoints"] == [
        {"name": "job-abcde", "manifest": "s3://bucket-1/runs/r/job-abcde/manifest.json",
         "uri": "s3://escrow/job-abcde", "step": None, "mean_reward": None},
        {"name": "job-fghij", "manifest": "s3://bucket-1/runs/r/job-fghij/manifest.json",
         "uri": None, "step": None, "mean_reward": None},
    ]  # fmt: skip
    # Nothing evaluated it against the start: the located one, said so.
    assert summary["best_checkpoint"] == {
        "name": "job-abcde",
        "uri": "s3://escrow/job-abcde",
        "why": "the last checkpoint; no held-out evaluation compared it with the start",
    }


def test_collect_lists_our_trainers_checkpoints_and_the_best_by_the_evaluation(
    state: dict,
) -> None:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="bucket-1")
    state["bucket"] = "bucket-1"
    manifest = CheckpointManifest(
        model="nova-lite-2",
        checkpoints=[
            SavedCheckpoint(name="step-000005", key="runs/r/checkpoints/step-000005.npz", step=5),
            SavedCheckpoint(
                name="final", key="runs/r/checkpoints/final.npz", step=7, mean_reward=0.5
            ),
        ],
    )
    s3.put_object(
        Bucket="bucket-1", Key="runs/r/checkpoints/manifest.json", Body=manifest.model_dump_json()
    )
    s3.put_object(Bucket="bucket-1", Key="runs/r/j-1/manifest.json", Body=b"{}")  # Nova's, too
    state["evaluations"] = {
        stage: {"stage": stage, "job": "j", "ready": True} for stage in ("baseline", "final")
    }
    # The trained model did worse than the one it started from on the held-out records.
    for stage, passed in (("baseline", [1, 1, 1, 0]), ("final", [0, 0, 1, 0])):
        s3.put_object(
            Bucket="bucket-1", Key=f"runs/r/evaluation/{stage}.jsonl", Body=_episodes(passed)
        )
    collect(steps(ENDED), state)
    summary = json.loads(s3.get_object(Bucket="bucket-1", Key="runs/r/summary.json")["Body"].read())
    assert [(c["name"], c["step"], c["uri"], c["mean_reward"]) for c in summary["checkpoints"]] == [
        ("j-1", None, None, None),
        ("step-000005", 5, "s3://bucket-1/runs/r/checkpoints/step-000005.npz", None),
        ("final", 7, "s3://bucket-1/runs/r/checkpoints/final.npz", 0.5),
    ]
    assert summary["best_checkpoint"] == {
        "name": None,
        "uri": None,
        "why": "the starting model did better on the held-out records",
    }


def test_the_state_is_parsed_once_and_typed(state: dict) -> None:
    """A step reads the run's config as registered (a TrainingConfig, not a dict to re-default);
    a state the steps before never completed is named, not a KeyError."""
    cluster = Scripted(JobStatus("pending"))
    assert steps(cluster).scale_up(state) == {
        "instances": CONFIG["instance_count"],
        "scale_to_zero": CONFIG["scale_to_zero"],
    }
    with pytest.raises(
        ValueError, match="s3://b/training-data/x.jsonl: the run was never registered"
    ):
        steps(cluster).submit_job({"bucket": "b", "key": "training-data/x.jsonl"})
    unregistered = {
        "bucket": "data-b",
        "key": "training-data/x.jsonl",
        "error": {"Error": "DatasetInvalid"},
    }
    assert steps(cluster).release_compute(unregistered) == {
        "workers_stopped": 0,
        "job_objects_deleted": 0,
    }


def _a_checkpoint_and_a_registry(state: dict) -> tuple[Any, Any, PipelineSettings]:
    """The run's bucket with a Nova job's checkpoint manifest, the deployment's model group, and
    the settings that name it: the S3 and SageMaker clients, and those settings."""
    s3, sagemaker = boto3.client("s3"), boto3.client("sagemaker")
    s3.create_bucket(Bucket="bucket-1")
    sagemaker.create_model_package_group(ModelPackageGroupName="nova-mtrl-models")
    state["bucket"] = "bucket-1"
    s3.put_object(
        Bucket="bucket-1", Key="runs/r/job-abcde/manifest.json",
        Body=b'{"checkpoint_s3_bucket": "s3://customer-escrow-1/job-abcde"}',
    )  # fmt: skip
    return s3, sagemaker, SETTINGS.model_copy(update={"model_package_group": "nova-mtrl-models"})


def test_collect_registers_the_best_checkpoint_with_its_evaluation_and_lineage(
    state: dict,
) -> None:
    s3, sagemaker, registry = _a_checkpoint_and_a_registry(state)
    state["evaluations"] = {
        stage: {"stage": stage, "job": "j", "ready": True} for stage in ("baseline", "final")
    }
    for stage, passed in (("baseline", [0, 0, 1, 0]), ("final", [1, 1, 1, 0])):
        s3.put_object(
            Bucket="bucket-1", Key=f"runs/r/evaluation/{stage}.jsonl", Body=_episodes(passed)
        )
    collect(steps(ENDED, settings=registry), state)
    summary = json.loads(s3.get_object(Bucket="bucket-1", Key="runs/r/summary.json")["Body"].read())
    package = sagemaker.describe_model_package(ModelPackageName=summary["model_package"])
    assert package["ModelPackageGroupName"] == "nova-mtrl-models"
    assert package["ModelApprovalStatus"] == "PendingManualApproval"
    assert package["MetadataProperties"] == {"GeneratedBy": EXECUTION}
    assert package["ModelMetrics"]["ModelQuality"]["Statistics"] == {
        "ContentType": "application/json", "S3Uri": "s3://bucket-1/runs/r/evaluation.json",
    }  # fmt: skip
    metadata = package["CustomerMetadataProperties"]
    assert metadata["mtrl:checkpoint"] == "s3://customer-escrow-1/job-abcde"
    assert metadata["mtrl:run_id"] == "r" and metadata["mtrl:evaluation"].startswith("pass@1 0.25")


def test_collect_records_the_package_a_managed_job_registered_and_registers_none(
    state: dict,
) -> None:
    """A serverless run's job registered the trained model itself: the summary names that
    package and the tokens AWS billed the job, and the registry holds no other (no checkpoint
    of ours is registered)."""
    s3, sagemaker, registry = _a_checkpoint_and_a_registry(state)
    package = "arn:aws:sagemaker:us-east-1:123456789012:model-package/nova-mtrl-models/7"
    tokens = {"TrainTokenCount": 120_000, "PrefillTokenCount": 90_000, "SampleTokenCount": 30_000}
    output = ServiceOutput(OutputModelPackageArn=package, BillableTokenUsage=tokens)
    collect(steps(Scripted(JobStatus(Phase.SUCCEEDED), managed=output), settings=registry), state)
    summary = json.loads(s3.get_object(Bucket="bucket-1", Key="runs/r/summary.json")["Body"].read())
    assert (summary["model_package"], summary["billable_token_usage"]) == (package, tokens)
    listed = sagemaker.list_model_packages(ModelPackageGroupName="nova-mtrl-models")
    assert listed["ModelPackageSummaryList"] == []


@pytest.fixture
def provisioned(state: dict) -> dict:
    """The state once the run's queues exist, its workers registered with the router, and a
    message of the phase before left on each queue the next phase's job reads or writes."""
    db, sqs = boto3.client("dynamodb"), boto3.client("sqs")
    create_table(db, "conversations")
    queues = create_run_queues(sqs, prefix="nova-mtrl", run_id="r")
    ConversationStore(db, "conversations").put_run(
        "r", token="t", queues=queues.urls(), model="m", now=0.0
    )
    resources = {"run_id": "r", "queues": queues.urls(), "alarms": [], "rollout_request_arn": "a"}
    return {**state, "resources": resources}


def left_on_the_queues(state: dict) -> dict[str, int]:
    sqs = boto3.client("sqs")
    counts = {}
    for kind, url in state["resources"]["queues"].items():
        attributes = sqs.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        counts[kind] = int(attributes["ApproximateNumberOfMessages"])
    return counts


def send_everywhere(state: dict) -> None:
    sqs = boto3.client("sqs")
    for kind, url in state["resources"]["queues"].items():
        sqs.send_message(
            QueueUrl=url, MessageBody="{}", MessageGroupId="g", MessageDeduplicationId=kind
        )


def test_opening_a_phase_empties_what_the_one_before_left_and_waits_sqs_purge(
    provisioned: dict,
) -> None:
    """The first phase finds new queues (no purge, no wait); each later one purges the four
    message queues (the dead letters stay) and asks the state machine to wait SQS's minute."""
    store = ConversationStore(boto3.client("dynamodb"), "conversations")
    send_everywhere(provisioned)
    first = steps().open_phase({"phase": "baseline", "state": provisioned})
    assert first == {"phase": "baseline", "purged": 0, "wait_seconds": 0}
    assert store.phase("r") == "baseline" and set(left_on_the_queues(provisioned).values()) == {1}

    second = steps().open_phase({"phase": "training", "state": provisioned})
    assert second == {"phase": "training", "purged": 4, "wait_seconds": PURGE_SECONDS}
    assert store.phase("r") == "training"
    assert left_on_the_queues(provisioned) == {**{kind: 0 for kind in KINDS}, QueueKind.DLQ: 1}


def test_a_phase_waits_as_long_as_the_deployment_says(provisioned: dict) -> None:
    local = SETTINGS.model_copy(update={"purge_seconds": 0})
    steps(settings=local).open_phase({"phase": "training", "state": provisioned})
    opened = steps(settings=local).open_phase({"phase": "final", "state": provisioned})
    assert opened["wait_seconds"] == 0 and opened["purged"] == 4


def test_a_phase_the_pipeline_does_not_have_is_refused(provisioned: dict) -> None:
    with pytest.raises(ValidationError, match="phase"):
        steps().open_phase({"phase": "midway", "state": provisioned})
    assert ConversationStore(boto3.client("dynamodb"), "conversations").phase("r") is None
