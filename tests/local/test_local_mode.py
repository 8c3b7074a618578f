"""`mtrl local`: the synthesized pipeline, the router, reward worker processes and the GRPO
trainer process on this machine. A run succeeds with a report and a reward curve, a fault in any
state fails it cleanly, and either way nothing is left: no queue, alarm, mapping or process."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from domain.evaluation import SAMPLE_PREFIX
from domain.trajectories import step_windows
from mtrl.cli import app
from mtrl.local.run import LocalRunError, LocalRunOptions, prepare, run_local
from tests.conftest import Synthesized

EXAMPLE = Path(__file__).parents[2] / "examples" / "wordle"


def _child_processes() -> set[int]:
    """This process's live children (Linux: /proc/self/task/*/children)."""
    children: set[int] = set()
    for listing in Path("/proc/self/task").glob("*/children"):
        try:
            children |= {int(pid) for pid in listing.read_text().split()}
        except FileNotFoundError:  # that thread has just ended
            continue
    alive = set()
    for pid in children:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def mlflow_runs(out_dir: Path) -> list:
    """The runs in an output folder's MLflow store (mtrl/local/tracking.py)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out_dir / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name("nova-mtrl").experiment_id])


@pytest.fixture
def small_config(tmp_path: Path) -> Path:
    """The example config, smaller: 2 secrets x 8 rollouts per step, one reward worker; each
    evaluation 8 held-out secrets x 2 rollouts."""
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    config.update(
        global_batch_size=16, max_steps=3, reward_workers=1, eval_max_records=8, eval_samples=2
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def template(default_app: Synthesized) -> dict:
    return default_app.template("pipeline")


def test_the_wordle_example_trains_and_leaves_nothing(
    tmp_path: Path, small_config: Path, template: dict
) -> None:
    before = _child_processes()
    outcome, directory = run_local(
        LocalRunOptions(EXAMPLE / "train.jsonl", config=str(small_config), out_dir=tmp_path),
        template=template,
        timeout_seconds=300,
    )
    assert outcome.status == "SUCCEEDED", (outcome.error, outcome.cause)
    report = json.loads((directory / "report.json").read_text())
    assert report["steps"] == 3 and [p["step"] for p in report["reward_curve"]] == [1, 2, 3]
    assert all(0.0 <= p["mean_reward"] <= p["max_reward"] <= 1.0 for p in report["reward_curve"])
    assert report["leftover"] == {"resources": 0, "processes": 0, "pollers": 0, "total": 0}
    assert report["teardown"]["leftover"] == 0 and report["teardown"]["queues_deleted"] == 5
    assert report["states"][:3] == ["Validate", "Register", "Provision"]
    assert report["states"][-3:] == ["Teardown", "NotifySuccess", "RunSucceeded"]
    # The compute planes were asked for what the config says, and released.
    actions = [event["action"] for event in report["compute_events"]]
    assert actions == [
        "scale_up", "start_workers", "submit_evaluation", "submit", "submit_evaluation",
        "stop_workers", "delete_job", "scale_down",
    ]  # fmt: skip
    # Evaluated before and after on the same 8 held-out secrets: three steps already win some.
    evaluation = report["evaluation"]
    assert {"EvaluateBaseline", "BaselineEvaluation", "EvaluateFinal", "FinalEvaluation"} <= set(
        report["states"]
    )
    baseline, final = evaluation["baseline"], evaluation["final"]
    assert (baseline["n"], final["n"], baseline["records"]) == (16, 16, 8)
    assert final["pass_at_1"] > baseline["pass_at_1"]
    assert final["mean_reward"] > baseline["mean_reward"]
    assert evaluation["delta"]["pass_at_1"]["delta"] == pytest.approx(
        final["pass_at_1"] - baseline["pass_at_1"]
    )
    assert report["compute_events"][0]["instances"] == 8
    assert report["compute_events"][1]["workers"] == 1
    assert (directory / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        (directory / "notification.txt")
        .read_text()
        .startswith(f"nova-mtrl run {outcome.run_id} SUCCEEDED")
    )
    outputs = directory / "outputs"
    assert (outputs / "checkpoints" / "final.npz").is_file()
    summary = json.loads((outputs / "summary.json").read_text())
    assert "metrics.jsonl" in summary["outputs"] and summary["config"]["max_steps"] == 3
    assert summary["evaluation"] == evaluation
    assert "held-out evaluation: pass@1 " in (directory / "notification.txt").read_text()
    trained = [json.loads(line) for line in (outputs / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollouts"] + m["failed_rollouts"] for m in trained] == [16, 16, 16]
    # Every rollout answered is kept once, as Parquet that pandas reads: 48 trained, 32 evaluated.
    trajectories = pd.read_parquet(outputs / "trajectories")
    assert len(trajectories) == trajectories["sample_id"].nunique() == 48 + 16 + 16
    assert set(trajectories["run_id"]) == {outcome.run_id}
    assert set(trajectories["config_hash"]) == {outcome.config.fingerprint}
    # Which weights played: step s's rollouts by the policy after s - 1 updates; the baseline
    # by the untrained one, the final evaluation by the one trained 3 steps.
    windows = step_windows(trained)
    finished = trajectories["finished_at"].map(lambda moment: moment.timestamp())
    for step, (began, ended) in windows.items():
        played = trajectories[(finished >= began) & (finished <= ended)]
        assert len(played) == 16 and set(played["policy_version"]) == {step - 1}
    evaluated = trajectories[trajectories["sample_id"].str.startswith(SAMPLE_PREFIX)]
    assert sorted(evaluated["policy_version"].value_counts().items()) == [(0, 16), (3, 16)]
    # Tracked in the output folder's MLflow store: the config, the curve, the evaluation.
    (tracked,) = mlflow_runs(tmp_path)
    assert (
        report["tracking"]
        == f"MLflow run {tracked.info.run_id} in sqlite:///{tmp_path / 'mlflow.db'}"
    )
    assert tracked.info.status == "FINISHED" and tracked.data.params["max_steps"] == "3"
    assert tracked.data.tags["config_hash"] == outcome.config.fingerprint
    assert tracked.data.metrics["train/mean_reward"] == trained[-1]["mean_reward"]
    assert tracked.data.metrics["eval/final/pass_at_1"] == final["pass_at_1"]
    history = json.loads((directory / "execution_history.json").read_text())
    assert history[-1]["type"] == "ExecutionSucceeded"
    assert all(
        (directory / "logs" / f"{job}.log").is_file() for job in ("trainer", "baseline", "final")
    )
    assert _child_processes() == before


def test_a_run_from_a_previous_runs_checkpoint_continues_its_curve(
    tmp_path: Path, small_config: Path, template: dict
) -> None:
    config = yaml.safe_load(small_config.read_text()) | {"max_steps": 1, "eval_max_records": 2}
    small_config.write_text(yaml.safe_dump(config))
    first, _ = run_local(
        LocalRunOptions(EXAMPLE / "train.jsonl", config=str(small_config), out_dir=tmp_path),
        template=template,
        timeout_seconds=300,
    )
    assert first.status == "SUCCEEDED", (first.error, first.cause)
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(config | {"base_checkpoint": f"run:{first.run_id}"}))
    second, directory = run_local(
        LocalRunOptions(EXAMPLE / "train.jsonl", config=str(again), out_dir=tmp_path),
        template=template,
        timeout_seconds=300,
    )
    assert second.status == "SUCCEEDED", (second.error, second.cause)
    assert second.run_id != first.run_id
    # Step 2 follows step 1, and the run's curve holds both.
    assert [m["step"] for m in second.metrics] == [2]
    outputs = directory / "outputs"
    curve = [json.loads(line) for line in (outputs / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in curve] == [1, 2]
    assert curve[0] == {k: v for k, v in first.metrics[0].items()}
    manifest = json.loads((outputs / "checkpoints" / "manifest.json").read_text())
    assert [(c["name"], c["step"]) for c in manifest["checkpoints"]] == [("final", 2)]


def test_a_base_run_that_is_not_there_is_refused_before_anything_exists(
    tmp_path: Path, small_config: Path
) -> None:
    config = yaml.safe_load(small_config.read_text()) | {"base_checkpoint": "run:gone-0123456789"}
    small_config.write_text(yaml.safe_dump(config))
    with pytest.raises(LocalRunError, match=r"base_checkpoint run:gone-0123456789: no local run"):
        prepare(
            LocalRunOptions(EXAMPLE / "train.jsonl", config=str(small_config), out_dir=tmp_path)
        )


FAULT_STATES = [
    "Validate", "Register", "Provision", "ScaleUp", "NodesReady", "StartWorkers", "WorkersHealthy",
    "EvaluateBaseline", "SubmitJob", "Monitor", "FinalEvaluation", "Collect", "ReleaseCompute",
    "Teardown", "NotifySuccess",
]  # fmt: skip


@pytest.mark.parametrize("state", FAULT_STATES)
def test_a_fault_in_any_state_fails_the_run_cleanly(
    tmp_path: Path,
    small_config: Path,
    template: dict,
    monkeypatch: pytest.MonkeyPatch,
    state: str,
) -> None:
    before = _child_processes()
    # One step, and one held-out rollout per evaluation — none where no evaluation state is
    # under test: the failure path is.
    evaluated = state in ("EvaluateBaseline", "FinalEvaluation")
    config = yaml.safe_load(small_config.read_text()) | {
        "max_steps": 1, "eval_max_records": 1, "eval_samples": 1,
        **({} if evaluated else {"eval_fraction": 0}),
    }  # fmt: skip
    small_config.write_text(yaml.safe_dump(config))
    monkeypatch.setattr("mtrl.local.run.pipeline_template", lambda: template)
    result = CliRunner().invoke(
        app,
        [
            "local", str(EXAMPLE / "train.jsonl"), "--config", str(small_config),
            "--out", str(tmp_path), "--inject-fault", state,
        ],
    )  # fmt: skip
    reason = f"InjectedFault: fault injected into {state}"
    assert result.exit_code == 1, result.output
    assert f"FAILED in {state}: {reason}" in result.output
    (report_file,) = tmp_path.glob("*/report.json")
    report = json.loads(report_file.read_text())
    assert (report["status"], report["failed_state"], report["reason"]) == ("FAILED", state, reason)
    assert report["teardown"]["leftover"] == 0
    assert report["leftover"]["total"] == 0, report["leftover"]
    assert "TeardownAfterFailure" in report["states"] and report["states"][-1] == "RunFailed"
    notification = (report_file.parent / "notification.txt").read_text()
    assert f"FAILED\nfailed in {state}: {reason}" in notification
    assert _child_processes() == before


def test_bad_input_is_refused_before_anything_exists(tmp_path: Path, template: dict) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "metadata": {"prompt": "Play.", "answer": "crane"}}\n{oops\n')
    with pytest.raises(
        LocalRunError, match=r"broken.jsonl: invalid dataset: line 2: not valid JSON"
    ):
        run_local(LocalRunOptions(broken, out_dir=tmp_path), template=template)
    with pytest.raises(LocalRunError, match=r"config nope.yaml: no such file"):
        run_local(LocalRunOptions(EXAMPLE / "train.jsonl", config="nope.yaml"), template=template)
    with pytest.raises(
        LocalRunError, match=r"--inject-fault Nope: no such state; choose one of Validate, "
    ):
        run_local(
            LocalRunOptions(EXAMPLE / "train.jsonl", inject_fault="Nope", out_dir=tmp_path),
            template=template,
        )
    assert not any(tmp_path.glob("*/report.json"))


def test_the_cli_exits_2_with_one_line_for_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["local", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "none.jsonl: no such file" in missing.output
    text = tmp_path / "data.txt"
    text.write_text("{}\n")
    wrong = runner.invoke(app, ["local", str(text)])
    assert wrong.exit_code == 2 and "the pipeline takes .jsonl uploads only" in wrong.output
    assert "Traceback" not in missing.output + wrong.output


def test_a_synth_that_fails_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> dict:
        raise RuntimeError("node: not found\nat spawn ...")

    monkeypatch.setattr("mtrl.local.run.pipeline_template", broken)
    result = CliRunner().invoke(
        app, ["local", str(EXAMPLE / "train.jsonl"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "cannot synthesize the pipeline stack (RuntimeError: node: not found)" in result.output
    assert "Traceback" not in result.output and not any(tmp_path.iterdir())


def test_a_router_process_that_cannot_start_is_one_line_not_a_traceback(
    tmp_path: Path, template: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("mtrl.local.run.pipeline_template", lambda: template)
    monkeypatch.setattr("mtrl.local.router_process.RouterProcess.MODULE", "no_such_router")
    before = _child_processes()
    result = CliRunner().invoke(
        app, ["local", str(EXAMPLE / "train.jsonl"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert (
        "error: the local router process (no_such_router) failed at 'start': it ended before "
        "answering; the last line of its log: "
    ) in result.output
    assert "No module named no_such_router" in result.output
    assert "Traceback" not in result.output and _child_processes() == before


def test_off_a_terminal_the_cli_prints_a_line_per_state_and_per_step(
    tmp_path: Path, small_config: Path, template: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Piped (CI, `| tee`, IDE consoles): plain progress lines instead of a silent bar, then
    the result table with where the picture is and what the run would cost on AWS."""
    monkeypatch.setattr("mtrl.local.run.pipeline_template", lambda: template)
    result = CliRunner().invoke(
        app,
        ["local", str(EXAMPLE / "train.jsonl"), "--config", str(small_config), "--out",
         str(tmp_path / "runs")],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    progress = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    steps = [line for line in progress if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all(re.fullmatch(r"step \d/3: reward \d\.\d{3}, wins \d+%", line) for line in steps)
    assert progress[0] == "pipeline: synthesizing the pipeline stack"
    assert "pipeline: validate" in progress and progress[-1] == "pipeline: SUCCEEDED", progress
    assert progress.count("pipeline: monitor") == 1  # a step polled again is said once
    assert not [line for line in progress if "router" in line]  # its functions are not steps
    # The output folder: the run's report, and the MLflow store every local run is tracked in.
    (run_directory,) = [p for p in (tmp_path / "runs").iterdir() if (p / "report.json").is_file()]
    assert {p.name for p in (tmp_path / "runs").iterdir()} == {
        run_directory.name, "mlflow.db", "mlflow-artifacts",
    }  # fmt: skip
    assert f"  reward curve: {run_directory / 'reward_curve.png'}" in lines
    assert any(line.startswith("  tracking: MLflow run ") for line in lines)
    assert (
        f"  trajectories: mtrl trajectories {run_directory.name} --out {tmp_path / 'runs'}" in lines
    )
    assert any(line.startswith("  cost: $0 here; on AWS this config costs $") for line in lines)
    trainer_log = (run_directory / "logs" / "trainer.log").read_text()
    assert "step 3/3: mean reward" in trainer_log and "final checkpoint saved" in trainer_log


def test_the_support_desk_agent_example_trains_with_tool_calls_end_to_end(
    tmp_path: Path, template: dict
) -> None:
    """The whole tool-calling path offline: the local policy answers generate requests with tool
    calls, the router carries them, the reward workers run the support desk's tools; the run
    succeeds, learns, evaluates and leaves nothing."""
    example = EXAMPLE.parent / "support_desk"
    config = yaml.safe_load((example / "config.yaml").read_text())
    config.update(
        global_batch_size=16, max_steps=3, reward_workers=1, eval_max_records=6, eval_samples=2
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    outcome, directory = run_local(
        LocalRunOptions(example / "train.jsonl", config=str(path), out_dir=tmp_path),
        template=template,
        timeout_seconds=300,
    )
    assert outcome.status == "SUCCEEDED", (outcome.error, outcome.cause)
    report = json.loads((directory / "report.json").read_text())
    assert report["leftover"]["total"] == 0
    trained = [
        json.loads(line)
        for line in (directory / "outputs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["rollouts"] for m in trained] == [16, 16, 16]
    # Every episode took turns (tool calls answered by tool messages); success is counted.
    assert all(m["turns_per_episode"] > 1 and m["win_rate"] is not None for m in trained)
    assert trained[-1]["mean_reward"] > trained[0]["mean_reward"]
    episodes = [
        json.loads(line)
        for stage in ("baseline", "final")
        for line in (directory / "outputs" / "evaluation" / f"{stage}.jsonl")
        .read_text()
        .splitlines()
    ]
    assert len(episodes) == 24 and all(e["stop_reason"] == "end_of_conversation" for e in episodes)


def sick_run(
    tmp_path: Path, small_config: Path, template: dict, sickness: str, **settings: Any
) -> tuple[dict, Path]:
    """A run of Wordle made sick (tests/local/sick_wordle.py), up to 40 steps, no evaluation:
    it must end FAILED; its report and folder."""
    config = yaml.safe_load(small_config.read_text()) | {
        "max_steps": 40, "eval_fraction": 0,
        "environment": str(Path(__file__).with_name("sick_wordle.py")),
        "environment_args": {"sickness": sickness}, **settings,
    }  # fmt: skip
    small_config.write_text(yaml.safe_dump(config))
    outcome, directory = run_local(
        LocalRunOptions(EXAMPLE / "train.jsonl", config=str(small_config), out_dir=tmp_path),
        template=template,
        timeout_seconds=300,
    )
    assert outcome.status == "FAILED"
    return json.loads((directory / "report.json").read_text()), directory


@pytest.mark.parametrize(
    ("sickness", "rule", "reason"),
    [
        (
            "same_reward",
            {"metric": "zero_variance_groups", "at_least": 1.0, "steps": 2, "action": "stop"},
            "of the GRPO groups had no reward variance (no learning signal)",
        ),
        (
            "flaky",
            {"metric": "env_error_rate", "at_least": 0.25, "steps": 2, "action": "stop"},
            "of the rollouts ended in an environment error",
        ),
    ],
)
def test_a_run_health_rule_stops_a_sick_run_and_leaves_nothing(
    tmp_path: Path, small_config: Path, template: dict, sickness: str, rule: dict, reason: str
) -> None:
    """An environment that gives every episode the same reward, or fails on half its records:
    the run's rule trips after two steps, Monitor stops the run, it ends FAILED with the rule's
    reason, torn down."""
    before = _child_processes()
    # Four records a step (groups of four): a step has groups that still score.
    report, directory = sick_run(
        tmp_path, small_config, template, sickness, health=[rule], group_size=4
    )
    assert report["failed_state"] == "TrainingJob"
    assert report["reason"].startswith("TrainingJobFailed: unhealthy: run health: ")
    assert reason in report["reason"]
    assert report["leftover"]["total"] == 0 and report["teardown"]["leftover"] == 0
    trained = (directory / "outputs" / "metrics.jsonl").read_text().splitlines()
    assert 2 <= len(trained) < 40  # stopped, long before its last step
    # Tracked as what it became: FAILED, with the rule's reason.
    (tracked,) = mlflow_runs(tmp_path)
    assert tracked.info.status == "FAILED" and reason in tracked.data.tags["failure"]
    assert _child_processes() == before


def test_an_environment_that_is_down_is_stopped_by_the_default_rules_not_a_crash(
    tmp_path: Path, small_config: Path, template: dict
) -> None:
    """Every rollout fails: the trainer records each step (nothing scored, nothing learned) and
    the default rule — half the rollouts failed for three steps — stops the run."""
    report, directory = sick_run(tmp_path, small_config, template, "down")
    assert re.search(
        r"unhealthy: run health: 100% of the rollouts failed \(no score\) on steps \d+-\d+ "
        r"\(failed_rollout_rate >= 0.5 for 3 steps in a row: stop\); the first failure: "
        r"reset: ConnectionError: the environment's backend is down",
        report["reason"],
    ), report["reason"]
    # The run's summary says what the environment said, not only that it failed.
    assert re.fullmatch(
        r"training step 1: reset: ConnectionError: the environment's backend is down",
        report["first_error"],
    ), report["first_error"]
    assert report["leftover"]["total"] == 0
    steps = [
        json.loads(line)
        for line in (directory / "outputs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps[0]["mean_reward"] is None and steps[0]["failed_rollouts"] == 16
    assert steps[0]["env_error_rollouts"] == 16


def test_the_run_summary_shows_the_first_failed_rollouts_error(tmp_path: Path) -> None:
    from mtrl.commands.local import _print_result
    from mtrl.console import out
    from mtrl.local.session import RunOutcome

    steps = [{"step": 1, "mean_reward": None, "max_reward": None, "zero_variance_groups": None,
              "turns_per_episode": None}, {"step": 2, "mean_reward": 0.5, "max_reward": 1.0,
              "zero_variance_groups": 0.0, "turns_per_episode": 3.0,
              "first_error": "step 3: OpenEnvError: step: EXECUTION_ERROR: boom"}]  # fmt: skip
    outcome = RunOutcome(
        run_id="r-1", status="SUCCEEDED", error=None, cause=None, states=[], history=[],
        metrics=steps, notification=None, teardown=None,
        leftover={"resources": 0, "processes": 0, "pollers": 0},
    )  # fmt: skip
    with out.capture() as captured:
        _print_result(outcome, tmp_path)
    assert (
        "first failed rollout: training step 2: step 3: OpenEnvError: step: EXECUTION_ERROR: boom"
        in captured.get()
    )
