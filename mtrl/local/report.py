"""The report of a local run, under `<out>/<run_id>/`:

- `report.json`: status, run id, where and why it failed, the states visited, the training
  steps, the reward curve, the held-out evaluation (`baseline`, `final`, `delta`), the teardown
  result and what was left behind;
- `reward_curve.png`: mean and best reward and win rate per training step, and the held-out
  evaluation before and after training beside it;
- `execution_history.json`: the Step Functions execution history;
- `metrics.jsonl`: the trainer's metrics, one line per step;
- `notification.txt`: the message the alert topic published;
- `outputs/`: what the run wrote under `runs/<run_id>/` (summary, metrics, checkpoints), and
  `logs/`: the reward workers' and the trainer's logs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from domain.step_metrics import first_step_error
from mtrl.local.session import RunOutcome

FAILED_PREFIX = "FailedIn"


def failed_state(outcome: RunOutcome) -> str | None:
    """The state the run failed in (the first `FailedIn<State>` it went through)."""
    for state in outcome.states:
        if state.startswith(FAILED_PREFIX):
            return state.removeprefix(FAILED_PREFIX)
    return None


def failure_reason(outcome: RunOutcome) -> str | None:
    """`Error: message` of the failure, from the execution's error and cause."""
    if outcome.status == "SUCCEEDED":
        return None
    cause = outcome.cause or ""
    try:
        parsed = json.loads(cause)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and "errorMessage" in parsed:
        cause = parsed["errorMessage"]
    return f"{outcome.error}: {cause}" if outcome.error else cause or outcome.status


def _first_error(outcome: RunOutcome) -> str | None:
    """The run's first failed rollout's error, from its training steps' metrics."""
    found = first_step_error(outcome.metrics)
    return f"training step {found[0]}: {found[1]}" if found else None


def report_data(outcome: RunOutcome) -> dict[str, Any]:
    curve = [
        {
            "step": m["step"],
            "mean_reward": m["mean_reward"],
            "max_reward": m["max_reward"],
            "win_rate": m.get("win_rate"),
            "zero_variance_groups": m["zero_variance_groups"],
            "turns_per_episode": m["turns_per_episode"],
        }
        for m in outcome.metrics
    ]
    return {
        "status": outcome.status,
        "run_id": outcome.run_id,
        "failed_state": failed_state(outcome),
        "reason": failure_reason(outcome),
        "config": outcome.config.name if outcome.config else None,
        "seconds": round(outcome.seconds, 1),
        "states": outcome.states,
        "steps": len(outcome.metrics),
        "reward_curve": curve,
        "evaluation": outcome.evaluation,
        "teardown": outcome.teardown,
        "leftover": {**outcome.leftover, "total": sum(outcome.leftover.values())},
        "notified": outcome.notification is not None,
        "health": outcome.health,
        "first_error": _first_error(outcome),
        "tracking": outcome.tracking,
        "compute_events": outcome.events,
    }


def write_report(
    outcome: RunOutcome, directory: Path, *, track: Callable[[], str] | None = None
) -> Path:
    """Every file of the report; `track` (the experiment tracker, given the rest of the report)
    runs before report.json is written, which says what it did."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "execution_history.json").write_text(
        json.dumps(outcome.history, indent=2, default=str) + "\n"
    )
    (directory / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in outcome.metrics))
    if outcome.notification is not None:
        (directory / "notification.txt").write_text(outcome.notification)
    if outcome.metrics:
        plot_reward_curve(
            outcome.metrics,
            directory / "reward_curve.png",
            title=outcome.run_id,
            evaluation=outcome.evaluation,
        )
    if track is not None:
        outcome.tracking = track()
    data = report_data(outcome)
    (directory / "report.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    return directory / "report.json"


# The before/after panel's figures: (label, key in an evaluation summary).
COMPARED = (("mean reward", "mean_reward"), ("pass@1", "pass_at_1"))


def plot_reward_curve(
    metrics: list[dict[str, Any]],
    path: Path,
    *,
    title: str,
    evaluation: dict[str, Any] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    compared = evaluation and evaluation.get("baseline") and evaluation.get("final")
    if compared:
        figure, (axes, panel) = plt.subplots(
            1, 2, figsize=(11, 4), dpi=100, gridspec_kw={"width_ratios": [2, 1]}
        )
        plot_before_after(panel, evaluation)
    else:
        figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
    # A step where no rollout scored is a gap in the curve.
    gap = float("nan")
    axes.plot(steps, [_or(m["mean_reward"], gap) for m in metrics], marker="o", label="mean reward")
    axes.plot(
        steps, [_or(m["max_reward"], gap) for m in metrics], linestyle="--", label="best reward"
    )
    wins = [m.get("win_rate") for m in metrics]
    if all(w is not None for w in wins):
        axes.plot(steps, wins, linestyle=":", label="win rate")
    axes.set(xlabel="training step", ylabel="reward, win rate", title=f"GRPO, local: {title}")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def plot_before_after(axes: Any, evaluation: dict[str, Any]) -> None:
    """Bars of the held-out evaluation's figures before and after training, the change's 95 %
    interval as the final bar's whisker."""
    shown = [(label, key) for label, key in COMPARED if evaluation["final"].get(key) is not None]
    positions = range(len(shown))
    width = 0.38
    for offset, stage in ((-width / 2, "baseline"), (width / 2, "final")):
        values = [evaluation[stage][key] or 0.0 for _, key in shown]
        errors = None
        if stage == "final":
            deltas = [evaluation.get("delta", {}).get(key) for _, key in shown]
            errors = [
                [d["delta"] - d["ci_low"] if d else 0.0 for d in deltas],
                [d["ci_high"] - d["delta"] if d else 0.0 for d in deltas],
            ]
        bars = axes.bar([p + offset for p in positions], values, width, yerr=errors, label=stage)
        axes.bar_label(bars, fmt="%.2f", padding=2)
    axes.set_xticks(list(positions), [label for label, _ in shown])
    axes.margins(y=0.2)  # room for the labels above the bars
    axes.set_title(f"held-out evaluation (n={evaluation['final']['n']})")
    axes.legend(loc="upper left")
