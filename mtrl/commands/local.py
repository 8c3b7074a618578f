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
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from mtrl.console import err, out
from training_configs import estimate

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
    trainer: Annotated[
        str,
        typer.Option(
            help="policy: the small local policy (no extra libraries); llm: the open-weights "
            "trainer with a real language model (--model; needs the `llm` extra)."
        ),
    ] = "policy",
    model: Annotated[
        str | None,
        typer.Option(
            help="With --trainer llm: the model to train, a directory, a Hugging Face Hub id or "
            "tiny (the default: a small random model built here). With --model-endpoint: the "
            "model name sent to it (default: default)."
        ),
    ] = None,
    records: Annotated[
        int, typer.Option(min=1, help="With --model-endpoint: how many records to play.")
    ] = 16,
    trainer_processes: Annotated[
        int,
        typer.Option(
            min=1,
            max=8,
            help="With --trainer llm: trainer processes that generate and train together "
            "(torchrun on the CPU, as one a GPU on a node).",
        ),
    ] = 1,
) -> None:
    """Run the deployed pipeline locally: validate, provision, train (real GRPO, small CPU
    policy), collect, tear down, notify. Exit 0 when the run succeeded, 1 when it failed (with
    the state and the reason), 2 for bad input."""
    try:
        from mtrl.local.router_process import RouterUnavailable
        from mtrl.local.run import TRAINERS, LocalRunError, LocalRunOptions, prepare
    except ImportError as missing:
        err.print(f"error: {EXTRAS_HINT} ({missing.name} is missing)", markup=False)
        raise typer.Exit(2) from None
    if trainer not in TRAINERS:
        err.print(f"error: --trainer {trainer}: choose one of {', '.join(TRAINERS)}")
        raise typer.Exit(2)
    if trainer_processes > 1 and trainer != "llm":
        err.print(f"error: --trainer-processes {trainer_processes}: only with --trainer llm")
        raise typer.Exit(2)
    options = LocalRunOptions(
        dataset=file,
        config=config,
        seed=seed,
        out_dir=out_dir,
        inject_fault=inject_fault,
        max_steps=steps,
        trainer=trainer,
        processes=trainer_processes,
        **({"model": model} if model and not model_endpoint else {}),
    )
    try:
        if model_endpoint:
            _preflight(prepare(options), model_endpoint, model or "default", records, out_dir)
            return
        outcome, directory = _run_with_progress(options)
    except KeyboardInterrupt:
        # The session has stopped its processes and embedded AWS by now. Exit at once: jsii's
        # node got the same Ctrl-C and its exit hook would only print a broken pipe.
        err.print("interrupted: the local run was stopped; nothing of it is left running")
        sys.stderr.flush()
        os._exit(130)
    except (LocalRunError, RouterUnavailable) as error:
        err.print(f"error: {error}", markup=False)
        raise typer.Exit(2) from None
    except ImportError as missing:
        err.print(f"error: {EXTRAS_HINT} ({missing.name} is missing)", markup=False)
        raise typer.Exit(2) from None
    _print_result(outcome, directory)
    raise typer.Exit(0 if outcome.status == "SUCCEEDED" else 1)


def _run_with_progress(options: Any) -> tuple[Any, Path]:
    from mtrl.local.run import pipeline_template, prepare, run_local
    from mtrl.local.session import Observer

    prepared = prepare(options)  # bad input fails here, before the synth
    progress = _Bars() if err.is_terminal else _Lines()
    with progress:
        progress.state("synthesizing the pipeline stack")
        try:
            template = pipeline_template()
        except Exception as error:  # noqa: BLE001 - jsii reports Node/CDK problems as anything
            raise _synth_failed(error) from None
        progress.state("uploading")
        result = run_local(
            options,
            prepared=prepared,
            template=template,
            observer=Observer(on_state=progress.state, on_step=progress.step),
        )
        progress.state(result[0].status, finished=True)
    return result


def _synth_failed(error: Exception) -> Exception:
    from mtrl.local.run import LocalRunError

    first_line = str(error).splitlines()[0] if str(error) else "no message"
    return LocalRunError(
        f"cannot synthesize the pipeline stack ({type(error).__name__}: {first_line}); local "
        "mode needs Node.js and the `cdk` extra, and the same cdk.json `make synth` accepts"
    )


def _step_line(metrics: dict[str, Any]) -> str:
    wins = metrics.get("win_rate")
    return f"reward {_reward(metrics['mean_reward'])}" + (
        f", wins {wins:.0%}" if wins is not None else ""
    )


def _reward(value: float | None) -> str:
    """A step's mean reward; none when no rollout of it scored."""
    return "none" if value is None else f"{value:.3f}"


class _Bars:
    """On a terminal: a spinner for the pipeline's state and a bar for the training steps."""

    def __init__(self) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(),
            console=err,
            transient=True,  # the table below says how it ended
        )
        self._pipeline = self._progress.add_task("pipeline", total=None, count="")
        self._training = self._progress.add_task("training", visible=False, count="")

    def __enter__(self) -> _Bars:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def state(self, state: str, *, finished: bool = False) -> None:
        done = {"total": 1, "completed": 1} if finished else {}
        self._progress.update(self._pipeline, description=f"pipeline: {state}", **done)

    def step(self, metrics: dict[str, Any], total: int) -> None:
        self._progress.update(
            self._training,
            completed=metrics["step"],
            total=total,
            visible=True,
            count=f"{metrics['step']}/{total}",
            description=f"training: {_step_line(metrics)}",
        )


class _Lines:
    """Off a terminal (a pipe, CI, an IDE): one plain line per pipeline state and per step."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._seen: set[str] = set()  # the polls re-enter their states: each is said once

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _line(self, text: str) -> None:
        err.print(f"[{time.monotonic() - self._started:5.0f} s] {text}", markup=False)

    def state(self, state: str, *, finished: bool = False) -> None:
        if state not in self._seen:
            self._seen.add(state)
            self._line(f"pipeline: {state}")

    def step(self, metrics: dict[str, Any], total: int) -> None:
        self._line(f"step {metrics['step']}/{total}: {_step_line(metrics)}")


def _evaluation_line(evaluation: dict[str, Any]) -> str:
    from domain.evaluation import EvaluationReport

    report = EvaluationReport.model_validate(evaluation)
    if report.headline():
        return str(report.headline())
    skipped = "; ".join(f"{stage}: {why}" for stage, why in report.skipped.items())
    said = f"skipped ({skipped})" if skipped else "nothing to compare"
    return f"{said}; {report.failures()}" if report.failures() else said


def _print_result(outcome: Any, directory: Path) -> None:
    """How the run ended: a table on a terminal, `key: value` lines (never cut) elsewhere."""
    from mtrl.local.report import report_data

    data = report_data(outcome)
    rows = [("status", data["status"])]
    if data["failed_state"] or data["reason"]:
        rows.append(("failed in", f"{data['failed_state']}: {data['reason']}"))
    curve = data["reward_curve"]
    if curve:
        first, last = curve[0], curve[-1]
        rows += [
            ("steps", str(len(curve))),
            (
                "mean reward",
                f"{_reward(first['mean_reward'])} (step {first['step']}) -> "
                f"{_reward(last['mean_reward'])} (step {last['step']})",
            ),
        ]
        if first.get("win_rate") is not None and last.get("win_rate") is not None:
            rows.append(("win rate", f"{first['win_rate']:.0%} -> {last['win_rate']:.0%}"))
    if data["evaluation"] is not None:
        rows.append(("held-out evaluation", _evaluation_line(data["evaluation"])))
    leftover = data["leftover"]
    rows += [
        (
            "left behind",
            f"{leftover['total']} ({leftover['resources']} AWS resources, "
            f"{leftover['processes']} processes, {leftover['pollers']} pollers)",
        ),
        ("notification", "sent" if data["notified"] else "none"),
        ("time", f"{data['seconds']:.0f} s"),
    ]
    if outcome.config is not None:
        per_hour = estimate(outcome.config).per_hour
        rows.append(
            (
                "cost",
                f"$0 here; on AWS this config costs ${per_hour:,.0f}/h "
                f"(≈ ${per_hour * data['seconds'] / 3600:,.2f} for this run's time)",
            )
        )
    rows.append(("report", str(directory / "report.json")))
    if (directory / "reward_curve.png").is_file():
        rows.append(("reward curve", str(directory / "reward_curve.png")))
    if (directory / "outputs" / "trajectories").is_dir():
        rows.append(
            ("trajectories", f"mtrl trajectories {outcome.run_id} --out {directory.parent}")
        )
    if data["first_error"]:
        rows.append(("first failed rollout", data["first_error"]))
    for warning in data["health"].values():
        rows.append(("run health", f"warning: {warning}"))
    if data["tracking"]:
        rows.append(("tracking", data["tracking"]))
    if out.is_terminal:
        table = Table(title=f"nova-mtrl local run {outcome.run_id}", show_header=False)
        table.add_column()
        table.add_column(overflow="fold")  # paths whole, folded if need be
        for key, value in rows:
            table.add_row(key, value)
        out.print(table)
    else:
        out.print(f"nova-mtrl local run {outcome.run_id}", markup=False, highlight=False)
        for key, value in rows:
            out.print(f"  {key}: {value}", markup=False, highlight=False, soft_wrap=True)
    if outcome.status != "SUCCEEDED":
        err.print(
            f"run {outcome.run_id} FAILED in {data['failed_state'] or '?'}: {data['reason']}",
            markup=False,
        )


def _preflight(prepared: Any, endpoint: str, model: str, limit: int, out_dir: Path) -> None:
    from domain.dataset import read_records
    from mtrl.local.preflight import preflight
    from reward_envs.registry import load
    from reward_envs.worker.model_client import OpenAICompatibleClient

    config = prepared.config
    with prepared.dataset.open("rb") as stream:
        chosen = [record for _, record in zip(range(limit), read_records(stream), strict=False)]
    err.print(f"preflight: {len(chosen)} records x {config.group_size} rollouts against {endpoint}")
    result = preflight(
        load(config.environment, **config.environment_args),
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
