"""The run's last word: an SNS message saying how it ended, with what a person needs next."""

from __future__ import annotations

from typing import Any

from domain.bucket import run_output_prefix
from domain.run_state import RunNotice, TornDown
from domain.runs import RunRecord


def summary(
    run: RunRecord | None,
    *,
    run_id: str,
    succeeded: bool,
    now: float,
    failed_state: str | None = None,
    error: str | None = None,
    teardown: TornDown | None = None,
    evaluation: str | None = None,
) -> RunNotice:
    """`evaluation`: the headline of the run's held-out evaluation (`pass@1 0.31 → 0.58 ...`);
    `run`: None for a run never registered (its dataset was invalid), known by `run_id` only."""
    registered = (
        {}
        if run is None
        else {
            "dataset": f"s3://{run.bucket}/{run.key}",
            "config": run.config_name,
            "duration_hours": round(run.hours(now), 3),
            "cost_estimate_usd": round(run.spent_usd(now), 2),
            "results": f"s3://{run.bucket}/{run_output_prefix(run.run_id)}",
            "evaluation": evaluation,
            "health": sorted(run.health.values()),
            "notes": run.notes,
        }
    )
    return RunNotice(
        run_id=run_id,
        status="SUCCEEDED" if succeeded else "FAILED",
        failed_state=failed_state,
        error=error,
        teardown=teardown,
        **registered,
    )


def alert_health(sns: Any, topic_arn: str, run_id: str, reasons: list[str]) -> str:
    """An alert while the run goes on: run-health warnings that started to hold."""
    answer = sns.publish(
        TopicArn=topic_arn,
        Subject=f"nova-mtrl {run_id}: run health warning"[:100],
        Message=f"nova-mtrl run {run_id} goes on, but:\n" + "\n".join(reasons),
        MessageAttributes={"status": {"DataType": "String", "StringValue": "WARNING"}},
    )
    return answer["MessageId"]


def notify(sns: Any, topic_arn: str, notice: RunNotice) -> str:
    lines = [f"nova-mtrl run {notice.run_id} {notice.status}"]
    if notice.status == "FAILED":
        lines.append(f"failed in {notice.failed_state}: {notice.error}")
    if notice.dataset is not None:
        lines += [
            f"dataset: {notice.dataset} (config {notice.config})",
            f"duration: {notice.duration_hours:.2f} h, estimated AWS cost "
            f"${notice.cost_estimate_usd:,.2f} (the config's hourly rate x duration)",
            f"results: {notice.results}",
        ]
    if notice.evaluation:
        lines.append(f"held-out evaluation: {notice.evaluation}")
    lines += [f"warning: {reason}" for reason in notice.health]
    lines += [f"note: {note}" for note in notice.notes]
    if notice.tracking:
        lines.append(f"experiment tracking: {notice.tracking}")
    if notice.teardown is not None:
        lines.append(f"teardown: {notice.teardown.leftover} resources left")
    details = notice.model_dump_json(indent=2, exclude_none=True, exclude={"message_id"})
    answer = sns.publish(
        TopicArn=topic_arn,
        Subject=f"nova-mtrl {notice.run_id}: {notice.status}"[:100],
        Message="\n".join(lines) + "\n\n" + details,
        MessageAttributes={"status": {"DataType": "String", "StringValue": notice.status}},
    )
    return answer["MessageId"]
