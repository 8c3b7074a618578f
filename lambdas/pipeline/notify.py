"""The run's last word: an SNS message saying how it ended, with what a person needs next."""

from __future__ import annotations

import json
from typing import Any

from domain.bucket import run_output_prefix
from domain.runs import RunRecord


def summary(
    run: RunRecord | None,
    *,
    run_id: str | None = None,
    succeeded: bool,
    now: float,
    failed_state: str | None = None,
    error: str | None = None,
    teardown: dict[str, int] | None = None,
    evaluation: str | None = None,
) -> dict[str, Any]:
    """`evaluation`: the headline of the run's held-out evaluation (`pass@1 0.31 → 0.58 ...`)."""
    if run is None:
        return {
            "run_id": run_id,
            "status": "SUCCEEDED" if succeeded else "FAILED",
            "failed_state": failed_state,
            "error": error,
            "teardown": teardown,
        }
    return {
        "run_id": run.run_id,
        "status": "SUCCEEDED" if succeeded else "FAILED",
        "dataset": f"s3://{run.bucket}/{run.key}",
        "config": run.config_name,
        "duration_hours": round(run.hours(now), 3),
        "cost_estimate_usd": round(run.spent_usd(now), 2),
        "results": f"s3://{run.bucket}/{run_output_prefix(run.run_id)}",
        "failed_state": failed_state,
        "error": error,
        "teardown": teardown,
        "evaluation": evaluation,
        "health": sorted(run.health.values()),
        "notes": run.notes,
    }


def alert_health(sns: Any, topic_arn: str, run_id: str, reasons: list[str]) -> str:
    """An alert while the run goes on: run-health warnings that started to hold."""
    answer = sns.publish(
        TopicArn=topic_arn,
        Subject=f"nova-mtrl {run_id}: run health warning"[:100],
        Message=f"nova-mtrl run {run_id} goes on, but:\n" + "\n".join(reasons),
        MessageAttributes={"status": {"DataType": "String", "StringValue": "WARNING"}},
    )
    return answer["MessageId"]


def notify(sns: Any, topic_arn: str, report: dict[str, Any]) -> str:
    lines = [f"nova-mtrl run {report['run_id']} {report['status']}"]
    if report["status"] == "FAILED":
        lines.append(f"failed in {report['failed_state']}: {report['error']}")
    if "dataset" in report:
        lines += [
            f"dataset: {report['dataset']} (config {report['config']})",
            f"duration: {report['duration_hours']:.2f} h, estimated AWS cost "
            f"${report['cost_estimate_usd']:,.2f} (the config's hourly rate x duration)",
            f"results: {report['results']}",
        ]
    if report.get("evaluation"):
        lines.append(f"held-out evaluation: {report['evaluation']}")
    lines += [f"warning: {reason}" for reason in report.get("health") or []]
    lines += [f"note: {note}" for note in report.get("notes") or []]
    if report.get("tracking"):
        lines.append(f"experiment tracking: {report['tracking']}")
    if report.get("teardown") is not None:
        lines.append(f"teardown: {report['teardown'].get('leftover', '?')} resources left")
    message = "\n".join(lines) + "\n\n" + json.dumps(report, indent=2)
    subject = f"nova-mtrl {report['run_id']}: {report['status']}"[:100]
    answer = sns.publish(
        TopicArn=topic_arn,
        Subject=subject,
        Message=message,
        MessageAttributes={"status": {"DataType": "String", "StringValue": report["status"]}},
    )
    return answer["MessageId"]
