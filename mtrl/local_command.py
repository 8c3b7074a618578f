"""`mtrl local FILE`: the whole pipeline on this machine, offline — or, with `--model-endpoint`,
the preflight of a dataset against a real model."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from mtrl.console import err, out

EXTRAS_HINT = (
    "local mode needs the `cdk` and `local` extras: pip install -e '.[cdk,local]' (or `make demo`)"
)


def local(
    file: Annotated[Path, typer.Argument(help="The dataset (.jsonl) to train on.")],
    config: Annotated[
        str | None,
        typer.Option(help="A training config: a YAML file or a shipped name (rft_multiturn_lora)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the trainer's sampling and policy.")] = 0,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Where the run's report goes (DIR/<run_id>/).")
    ] = Path("runs"),
    inject_fault: Annotated[
        str | None,
        typer.Option(help="Make this pipeline state fail, to see teardown and notification."),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(min=1, help="Override the config's max_steps for this run.")
    ] = None,
    model_endpoint: Annotated[
        str | None,
        typer.Option(
            help="Evaluate only: play the dataset against this OpenAI-compatible server "
            "(e.g. http://127.0.0.1:8000/v1) and report the reward spread; no training."
        ),
    ] = None,
    model: Annotated[str, typer.Option(help="Model name sent to --model-endpoint.")] = "default",
    records: Annotated[
        int, typer.Option(min=1, help="With --model-endpoint: how many records to play.")
    ] = 16,
) -> None:
    """Run the deployed pipeline locally: validate, provision, train (real GRPO, small CPU
    policy), collect, tear down, notify. Exit 0 when the run succeeded, 1 when it failed (with
    the state and the reason), 2 for bad input."""
    try:
        from mtrl.local.run import LocalRunError, LocalRunOptions, prepare
    except ImportError as missing:
        err.print(f"error: {EXTRAS_HINT} ({missing.name} is missing)")
        raise typer.Exit(2) from None
    options = LocalRunOptions(
        dataset=file,
        config=config,
        seed=seed,
        out_dir=out_dir,
        inject_fault=inject_fault,
        max_steps=steps,
    )
    try:
        if model_endpoint:
            _preflight(prepare(options), model_endpoint, model, records, out_dir)
            return
        outcome, directory = _run_with_progress(options)
    except KeyboardInterrupt:
        # The session has stopped its processes and embedded AWS by now. Exit at once: jsii's
        # node got the same Ctrl-C and its exit hook would only print a broken pipe.
        err.print("interrupted: the local run was stopped; nothing of it is left running")
        sys.stderr.flush()
        os._exit(130)
    except LocalRunError as error:
        err.print(f"error: {error}", markup=False)
        raise typer.Exit(2) from None
    except ImportError as missing:
        err.print(f"error: {EXTRAS_HINT} ({missing.name} is missing)")
        raise typer.Exit(2) from None
    _print_result(outcome, directory)
    raise typer.Exit(0 if outcome.status == "SUCCEEDED" else 1)


def _run_with_progress(options: Any) -> tuple[Any, Path]:
    from mtrl.local.run import LocalRunError, pipeline_template, prepare, run_local
    from mtrl.local.session import Observer

    prepared = prepare(options)  # bad input fails here, before the synth
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,  # the table below says how it ended
    ) as progress:
        pipeline = progress.add_task("synthesizing the pipeline stack", total=None)
        try:
            template = pipeline_template()
        except Exception as error:  # noqa: BLE001 - jsii reports Node/CDK problems as anything
            raise LocalRunError(
                f"cannot synthesize the pipeline stack ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else 'no message'}); local mode needs "
                "Node.js and the `cdk` extra, and the same cdk.json `make synth` accepts"
            ) from None
        progress.update(pipeline, description="pipeline: uploading")
        training = progress.add_task(
            "training: waiting for the job", total=prepared.config.max_steps, visible=False
        )

        def on_state(state: str) -> None:
            progress.update(pipeline, description=f"pipeline: {state}")

        def on_step(metrics: dict[str, Any], total: int) -> None:
            wins = metrics.get("win_rate")
            shown = f", wins {wins:.0%}" if wins is not None else ""
            progress.update(
                training,
                completed=metrics["step"],
                total=total,
                visible=True,
                description=f"training: reward {metrics['mean_reward']:.3f}{shown}",
            )

        result = run_local(
            options,
            prepared=prepared,
            template=template,
            observer=Observer(on_state=on_state, on_step=on_step),
        )
        progress.update(pipeline, total=1, completed=1, description=f"pipeline: {result[0].status}")
    return result


def _print_result(outcome: Any, directory: Path) -> None:
    from mtrl.local.report import report_data

    data = report_data(outcome)
    table = Table(title=f"nova-mtrl local run {outcome.run_id}", show_header=False)
    table.add_row("status", data["status"])
    if data["failed_state"] or data["reason"]:
        table.add_row("failed in", f"{data['failed_state']}: {data['reason']}")
    curve = data["reward_curve"]
    if curve:
        first, last = curve[0], curve[-1]
        table.add_row("steps", str(len(curve)))
        table.add_row(
            "mean reward",
            f"{first['mean_reward']:.3f} (step 1) -> {last['mean_reward']:.3f} (step {last['step']})",
        )
        if last.get("win_rate") is not None:
            table.add_row("win rate", f"{first['win_rate']:.0%} -> {last['win_rate']:.0%}")
    leftover = data["leftover"]
    table.add_row(
        "left behind",
        f"{leftover['total']} ({leftover['resources']} AWS resources, "
        f"{leftover['processes']} processes, {leftover['pollers']} pollers)",
    )
    table.add_row("notification", "sent" if data["notified"] else "none")
    table.add_row("time", f"{data['seconds']:.0f} s")
    table.add_row("report", str(directory / "report.json"))
    out.print(table)
    if outcome.status != "SUCCEEDED":
        err.print(
            f"run {outcome.run_id} FAILED in {data['failed_state'] or '?'}: {data['reason']}",
            markup=False,
        )


def _preflight(prepared: Any, endpoint: str, model: str, limit: int, out_dir: Path) -> None:
    from domain.dataset import read_records
    from mtrl.local.evaluate import evaluate
    from reward_envs.registry import load
    from reward_envs.worker.model_client import OpenAICompatibleClient

    config = prepared.config
    with prepared.dataset.open("rb") as stream:
        chosen = [record for _, record in zip(range(limit), read_records(stream), strict=False)]
    err.print(f"preflight: {len(chosen)} records x {config.group_size} rollouts against {endpoint}")
    result = evaluate(
        load(config.environment),
        OpenAICompatibleClient(endpoint, model),
        chosen,
        group_size=config.group_size,
        max_turns=config.max_turns,
        timeout=config.rollout_timeout_seconds,
    )
    summary = {"endpoint": endpoint, "model": model, **result.summary()}
    directory = out_dir / f"preflight-{time.strftime('%Y%m%d-%H%M%S')}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    reward = summary["reward"]
    table = Table(title="preflight: does GRPO have a signal?", show_header=False)
    table.add_row("rollouts", f"{summary['rollouts']} ({summary['scored']} scored)")
    table.add_row("stop reasons", ", ".join(f"{k} {v}" for k, v in summary["stop_reasons"].items()))
    if reward["mean"] is not None:
        table.add_row(
            "reward",
            f"mean {reward['mean']:.3f}, stdev {reward['stdev']:.3f}, min {reward['min']:.3f}, max {reward['max']:.3f}",
        )
    table.add_row("zero-variance groups", f"{summary['zero_variance_groups']:.0%}")
    table.add_row("report", str(directory / "report.json"))
    out.print(table)
    if summary["errors"]:
        err.print(f"first errors: {'; '.join(summary['errors'])}", markup=False)
    if not summary["scored"]:
        err.print("error: no rollout got a reward; check the endpoint and the model name")
        raise typer.Exit(1)
    if summary["zero_variance_groups"] > 0.5:
        err.print(
            "warning: most groups have no reward spread: GRPO would learn little; "
            "make the task easier or harder, or raise group_size"
        )
