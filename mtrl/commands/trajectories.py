"""`mtrl trajectories RUN`: a run's kept rollouts, readably — a table, then the conversations
of a small selection turn by turn with each turn's reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.markup import escape
from rich.table import Table

from mtrl.commands.aws import Prefix, Profile, Region, aws_failure, deployed
from mtrl.console import fail, out
from mtrl.ops.trajectories import (
    NoTrajectories,
    RunTrajectories,
    from_bucket,
    from_folder,
    select,
)

# Longer texts are cut when shown (the files keep them whole).
SHOWN_CHARACTERS = 1500


def trajectories_command(
    run_id: Annotated[str, typer.Argument(help="The run id (`mtrl runs`, or a local run's).")],
    worst: Annotated[
        int | None, typer.Option(min=1, help="The N lowest rewards (failed rollouts first).")
    ] = None,
    best: Annotated[int | None, typer.Option(min=1, help="The N highest rewards.")] = None,
    step: Annotated[
        int | None, typer.Option(min=1, help="The rollouts of training step S.")
    ] = None,
    sample: Annotated[str | None, typer.Option(help="One sample's rollout, by its id.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many rows.")] = 20,
    conversations: Annotated[
        bool | None,
        typer.Option(
            "--conversations/--no-conversations",
            help="Print the conversations (default: when 5 or fewer are selected).",
        ),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Where local runs are (`mtrl local --out`).")
    ] = Path("runs"),
    prefix: Prefix = None,
    profile: Profile = None,
    region: Region = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines, for scripts.")] = False,
) -> None:
    """A run's trajectories (every finished rollout): a local run's from --out, else the
    deployment's data bucket."""
    if worst is not None and best is not None:
        raise fail("--worst and --best pick opposite ends; give one")
    try:
        run = _load(run_id, out_dir, prefix, profile, region)
        rows = select(run, step=step, worst=worst, best=best, sample=sample)
    except NoTrajectories as missing:
        raise fail(str(missing), code=1) from None
    shown = rows[:limit]
    if as_json:
        for row in shown:  # one object a line
            typer.echo(json.dumps(_plain(row)))
        return
    out.print(_table(run, rows, shown))
    if conversations if conversations is not None else len(shown) <= 5:
        for row in shown:
            _print_conversation(row)


def _load(
    run_id: str, out_dir: Path, prefix: str | None, profile: str | None, region: str | None
) -> RunTrajectories:
    outputs = out_dir / run_id / "outputs"
    if outputs.is_dir():
        return from_folder(run_id, outputs)
    session, deployment = deployed(prefix, profile, region)
    try:
        return from_bucket(session.client("s3"), bucket=deployment.data_bucket, run_id=run_id)
    except (ClientError, BotoCoreError) as error:
        raise aws_failure(error) from None


def _table(run: RunTrajectories, rows: list[dict[str, Any]], shown: list[dict[str, Any]]) -> Table:
    more = f", {len(rows) - len(shown)} more not shown (--limit)" if len(rows) > len(shown) else ""
    table = Table(
        title=f"run {run.run_id}: {len(rows)} of {len(run.rows)} trajectories{more}",
        caption=run.where,
    )
    for column in ("sample", "reward", "turns", "ended", "truncated", "policy", "finished"):
        table.add_column(
            column,
            justify="right" if column in ("reward", "turns") else "left",
            overflow="fold",
        )
    for row in shown:
        table.add_row(
            escape(row["sample_id"]),
            "—" if row["reward"] is None else f"{row['reward']:.3f}",
            str(row["turns"]),
            row["stop_reason"],
            str(row["truncated_turns"]) if row["truncated_turns"] else "",
            "" if row["policy_version"] is None else f"v{row['policy_version']}",
            row["finished_at"].strftime("%H:%M:%S"),
        )
    return table


def _print_conversation(row: dict[str, Any]) -> None:
    reward = "failed" if row["reward"] is None else f"reward {row['reward']:.3f}"
    out.rule(f"{escape(row['sample_id'])} · {reward} · {row['stop_reason']}")
    rewards = iter(row["turn_rewards"])
    turn = 0
    for message in json.loads(row["messages"]):
        role = message.get("role", "?")
        if role == "assistant":
            turn += 1
        out.print(
            f"[bold]{escape(role)}[/bold]" + (f" (turn {turn})" if role == "assistant" else "")
        )
        if content := message.get("content"):
            out.print(escape(_cut(content if isinstance(content, str) else json.dumps(content))))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            out.print(
                f"  → {escape(str(function.get('name')))}({escape(_cut(str(function.get('arguments'))))})"
            )
        if role == "assistant" and (reward_of_turn := next(rewards, None)) is not None:
            out.print(f"  [dim]turn reward {reward_of_turn:+.3f}[/dim]")
    if row["error"]:
        out.print(f"[red]error:[/red] {escape(row['error'])}")


def _cut(text: str) -> str:
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS]}… ({len(text) - SHOWN_CHARACTERS} more characters)"


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {
        **row,
        "finished_at": row["finished_at"].isoformat(),
        "messages": json.loads(row["messages"]),
        "metrics": dict(row["metrics"]),
    }
