"""Experiment tracking: a run's MLflow record (params, metrics by step, evaluation, tags), its
round trip through a local SQLite store, and a run that is not tracked when MLflow is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from domain.tracking import (
    EXPERIMENT,
    MAX_ENTITIES,
    MAX_METRICS,
    MAX_PARAMS,
    MAX_TAGS,
    TrackedRun,
    tracked_run,
)
from mtrl.local.run import track
from mtrl.local.session import RunOutcome
from mtrl.local.tracking import (
    STORE,
    TrackingUnavailable,
    open_store,
    store_uri,
    track_locally,
)
from training_configs.schema import load_training_config

CONFIG = load_training_config("rft_multiturn_lora")
METRICS = [
    {"step": 1, "mean_reward": 0.1, "win_rate": 0.0, "rollouts": 16, "finished_at": 1.8e9,
     "params": [0.1], "partial": False, "kl": None},
    {"step": 2, "mean_reward": 0.4, "win_rate": 0.25, "rollouts": 16, "finished_at": 1.8e9 + 9},
]  # fmt: skip
EVALUATION = {
    "baseline": {"n": 16, "mean_reward": 0.1, "pass_at_1": 0.0},
    "final": {"n": 16, "mean_reward": 0.6, "pass_at_1": 0.5},
    "delta": {"pass_at_1": {"delta": 0.5, "low": 0.2, "high": 0.8}},
    "skipped": {},
}


def record(**overrides) -> TrackedRun:
    arguments = {
        "run_id": "wordle-0a1b2c3d4e",
        "succeeded": True,
        "config": CONFIG,
        "dataset": "examples/wordle/train.jsonl",
        "metrics": METRICS,
        "evaluation": EVALUATION,
        "health": {"env_error_rate": "12% of rollouts hit an environment error"},
        "artifacts": {"summary.json": b'{"ok": true}'},
    } | overrides
    return tracked_run(**arguments)


def test_the_record_carries_the_config_steps_and_evaluation() -> None:
    run = record()
    assert run.params["max_steps"] == str(CONFIG.max_steps)
    assert run.params["lora.alpha"] == str(CONFIG.lora.alpha)  # nested by dotted path
    by_key = {(m.key, m.step): m.value for m in run.metrics}
    assert by_key[("train/mean_reward", 1)] == 0.1 and by_key[("train/mean_reward", 2)] == 0.4
    # Times, the step, the policy's parameters, flags and nulls are not measures.
    assert not {key for key, _ in by_key} & {"train/finished_at", "train/step", "train/params"}
    assert ("train/partial", 1) not in by_key and ("train/kl", 1) not in by_key
    assert by_key[("eval/baseline/pass_at_1", 0)] == 0.0
    assert by_key[("eval/final/pass_at_1", 2)] == 0.5
    assert by_key[("eval/delta/pass_at_1.low", 2)] == 0.2
    assert run.tags["config_hash"] == CONFIG.fingerprint and run.status == "FINISHED"
    assert run.tags["health/env_error_rate"].startswith("12%")
    failed = record(succeeded=False, reason="RunUnhealthy: all groups zero-variance")
    assert failed.status == "FAILED" and failed.tags["failure"].startswith("RunUnhealthy")


def test_a_large_record_goes_in_requests_mlflow_accepts() -> None:
    many = [{"step": step, "mean_reward": 0.5, "kl": 0.1} for step in range(1, 701)]
    run = record(metrics=many)
    batches = list(run.batches())
    assert len(batches) == 2 and all(len(metrics) <= MAX_METRICS for metrics, _, _ in batches)
    assert sum(len(metrics) for metrics, _, _ in batches) == len(run.metrics) == 1400 + 9
    assert all(len(params) <= MAX_PARAMS for _, params, _ in batches)
    assert all(sum(map(len, batch)) <= MAX_ENTITIES for batch in batches)
    assert {key for _, params, _ in batches for key in params} == set(run.params)


def test_the_batch_limits_are_mlflows() -> None:
    from mlflow.utils import validation

    assert (MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ENTITIES) == (
        validation.MAX_METRICS_PER_BATCH, validation.MAX_PARAMS_TAGS_PER_BATCH,
        validation.MAX_PARAMS_TAGS_PER_BATCH, validation.MAX_ENTITIES_PER_BATCH,
    )  # fmt: skip


def test_a_run_round_trips_through_the_local_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    mlflow_id = track_locally(record(), tmp_path)
    client = MlflowClient(tracking_uri=store_uri(tmp_path))
    stored = client.get_run(mlflow_id)
    assert (tmp_path / STORE).is_file()
    assert stored.info.status == "FINISHED" and stored.info.run_name == "wordle-0a1b2c3d4e"
    assert stored.data.params["max_steps"] == str(CONFIG.max_steps)
    curve = client.get_metric_history(mlflow_id, "train/mean_reward")
    assert [(point.step, point.value) for point in curve] == [(1, 0.1), (2, 0.4)]
    assert stored.data.metrics["eval/final/pass_at_1"] == 0.5
    assert stored.data.tags["run_id"] == "wordle-0a1b2c3d4e"
    assert [a.path for a in client.list_artifacts(mlflow_id)] == ["summary.json"]
    # A second run joins the same experiment: `mlflow ui` shows them side by side. It goes to the
    # store opened beforehand, as `mtrl local` opens it while the run goes on.
    track_locally(record(run_id="wordle-9f8e7d6c5b"), tmp_path, store=open_store(tmp_path))
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert len(client.search_runs([experiment.experiment_id])) == 2


def test_a_store_opened_ahead_is_made_and_holds_nothing_yet(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    open_store(tmp_path / "runs")
    assert (tmp_path / "runs" / STORE).is_file()
    client = MlflowClient(tracking_uri=store_uri(tmp_path / "runs"))
    assert client.search_experiments(filter_string=f"name = '{EXPERIMENT}'") == []


def test_without_mlflow_a_run_is_reported_untracked_not_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in ("mlflow", "mlflow.entities", "mlflow.tracking"):
        monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError
    with pytest.raises(TrackingUnavailable, match=r"pip install 'nova-mtrl\[tracking\]'"):
        track_locally(record(), tmp_path)
    outcome = RunOutcome(
        run_id="wordle-0a1b2c3d4e", status="SUCCEEDED", error=None, cause=None, states=[],
        history=[], metrics=METRICS, notification=None, teardown=None, leftover={},
        config=CONFIG,
    )  # fmt: skip
    said = track(outcome, Path("data.jsonl"), tmp_path / outcome.run_id, tmp_path)
    assert said.startswith("not tracked: MLflow is not installed")
    # Likewise when the store was being opened while the run went on.
    with ThreadPoolExecutor(max_workers=1) as background:
        store = background.submit(open_store, tmp_path)
        said = track(outcome, Path("data.jsonl"), tmp_path / outcome.run_id, tmp_path, store)
    assert said.startswith("not tracked: MLflow is not installed")
    assert not (tmp_path / STORE).exists()


def test_the_records_tags_times_and_limits_are_mlflows() -> None:
    nova = [
        {"step": 1, "mean_reward": 0.2, "last_report_at": 1.8e9},
        {"step": 2, "mean_reward": 0.3, "finished_at": 1.8e9 + 5.5},
    ]
    run = record(metrics=nova, evaluation={**EVALUATION, "skipped": {"final": "why"}, "note": "x"})
    assert {key: run.tags[key] for key in ("dataset", "model", "recipe", "environment")} == {
        "dataset": "examples/wordle/train.jsonl", "model": CONFIG.model,
        "recipe": str(CONFIG.recipe), "environment": CONFIG.environment,
    }  # fmt: skip
    stamps = {m.step: m.timestamp_ms for m in run.metrics if m.key == "train/mean_reward"}
    assert stamps == {1: 1_800_000_000_000, 2: 1_800_000_005_500}  # when each step ended
    assert {m.key for m in run.metrics if m.key.startswith("eval/")} == {
        "eval/baseline/n", "eval/baseline/mean_reward", "eval/baseline/pass_at_1",
        "eval/final/n", "eval/final/mean_reward", "eval/final/pass_at_1",
        "eval/delta/pass_at_1.delta", "eval/delta/pass_at_1.low", "eval/delta/pass_at_1.high",
    }  # fmt: skip
    # No step written yet: the evaluation's final figures go at step 0.
    assert {m.step for m in record(metrics=[]).metrics} == {0}
    # A value longer than MLflow takes is cut to fit; a key to 250 characters; None is empty.
    long = CONFIG.model_copy(update={"environment_args": {"x" * 300: "y" * 7000, "none": None}})
    params = record(config=long).params
    cut = params[("environment_args." + "x" * 300)[:250]]
    assert len(cut) == 6000 and cut.endswith("…") and cut.startswith("y")
    assert params["environment_args.none"] == ""
    assert record().params["name"] == CONFIG.name  # values as JSON gives them


def test_many_params_and_tags_go_in_several_requests() -> None:
    many = CONFIG.model_copy(update={"environment_args": {f"k{i}": i for i in range(150)}})
    run = record(config=many, health={f"m{i}": "warned" for i in range(120)})
    batches = list(run.batches())
    assert 200 < len(run.params) <= 300 and 100 < len(run.tags) <= 200
    assert len(batches) == 3
    assert [len(params) for _, params, _ in batches] == [100, 100, len(run.params) - 200]
    assert [len(tags) for _, _, tags in batches] == [100, len(run.tags) - 100, 0]
    assert {k for _, _, tags in batches for k in tags} == set(run.tags)


TELEMETRY_PROBE = """
import os, sys
from pathlib import Path
from tests.local.test_tracking import record
from mtrl.local.tracking import track_locally
track_locally(record(), Path(sys.argv[1]))
from mlflow.telemetry.utils import is_telemetry_disabled
print(is_telemetry_disabled(), os.environ.get("MLFLOW_DISABLE_TELEMETRY"))
"""


@pytest.mark.parametrize(("given", "kept"), [(None, "true"), ("1", "1")])
def test_a_local_run_sends_no_telemetry_to_mlflows_servers(
    tmp_path: Path, given: str | None, kept: str
) -> None:
    """MLflow starts its usage telemetry on import, except in CI and tests (it looks for their
    variables): a local run, as a user starts it outside either, keeps it off — or as the user
    set it."""
    # Should telemetry start anyway, its requests go to a closed port here, never out.
    closed = "http://127.0.0.1:9"
    environment = {
        "PATH": os.environ["PATH"], "HOME": str(tmp_path), "HTTPS_PROXY": closed,
        "HTTP_PROXY": closed,
    }  # fmt: skip
    if given is not None:
        environment["MLFLOW_DISABLE_TELEMETRY"] = given
    probe = subprocess.run(
        [sys.executable, "-c", TELEMETRY_PROBE, str(tmp_path)],
        cwd=Path(__file__).parents[2], env=environment, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["True", kept]
