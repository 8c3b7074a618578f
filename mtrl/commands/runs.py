"""`mtrl submit / runs / status / cost / logs / teardown`: the run loop on a deployed platform."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.table import Table

from domain.dataset import counted
from domain.runs import RunStore
from mtrl.commands.aws import (
    AsJson,
    ConfigName,
    Prefix,
    Profile,
    Region,
    apply_change,
    aws_failure,
    deployed,
)
from mtrl.console import check_dataset, fail, out, print_problem
from mtrl.ops.deployment import (
    Deployment,
    DeploymentError,
)
from mtrl.ops.logs import Plane, follow, read, sources
from mtrl.ops.runs_view import (
    QueueDepth,
    RunDetails,
    RunSummary,
    UnknownRun,
    billed_tokens,
    list_runs,
    run_status,
    summarize,
)
from mtrl.ops.submit import SubmitError, choose_config, submit
from mtrl.ops.teardown import TeardownFailed, release_idle_nodes, teardown_run
from training_configs import TrainingConfigError, estimate, load_training_config
from training_configs.schema import DEFAULT_CONFIG, SHARES

STATUS_SERVICES = ("dynamodb", "stepfunctions", "s3", "sqs", "cloudwatch", "ecs", "sagemaker")


def submit_command(
    file: Annotated[Path, typer.Argument(help="The dataset (.jsonl) to train on.")],
    config: ConfigName = None,
    name: Annotated[
        str | None, typer.Option(help="The object name under training-data/ (default: the file's).")
    ] = None,
    prefix: Prefix = None,
    profile: Profile = None,
    region: Region = None,
    as_json: AsJson = False,
) -> None:
    """Check a dataset and its config here, then upload them: the upload starts the run."""
    summary = check_dataset(file, print_problem)
    if not summary.valid:
        raise fail(f"{file}: {counted(summary.problems, 'problem')}; nothing was uploaded", code=1)
    try:
        chosen = choose_config(config)
    except (TrainingConfigError, SubmitError) as error:
        raise fail(str(error)) from None
    session, deployment = deployed(prefix, profile, region)
    try:
        submitted = submit(session.client("s3"), deployment, dataset=file, chosen=chosen, name=name)
    except SubmitError as error:
        raise fail(str(error)) from None
    except (ClientError, BotoCoreError) as error:
        raise aws_failure(error) from None
    if as_json:
        out.print_json(json.dumps({**asdict(submitted), "cost_per_hour": chosen.cost.per_hour}))
        return
    out.print(f"run {submitted.run_id} submitted", highlight=False)
    out.print(f"  dataset    {submitted.dataset_uri}", highlight=False)
    out.print(f"  config     {submitted.config_name}", highlight=False)
    out.print(f"  cost       {chosen.cost.describe()}", highlight=False, soft_wrap=True)
    out.print(f"  execution  {submitted.console_url}", highlight=False, soft_wrap=True)
    out.print(f"  watch      mtrl status {submitted.run_id} --watch", highlight=False)


def runs_command(
    prefix: Prefix = None, profile: Profile = None, region: Region = None, as_json: AsJson = False
) -> None:
    """The deployment's runs, newest first: status, config, time, cost so far, deadline."""
    session, deployment = deployed(prefix, profile, region)
    try:
        runs = list_runs(session.client("dynamodb"), deployment, now=time.time())
    except (ClientError, BotoCoreError) as error:
        raise aws_failure(error) from None
    if as_json:
        out.print_json(json.dumps([asdict(run) for run in runs]))
        return
    table = Table("run", "status", "config", "elapsed", "cost so far", "deadline in",
                  "held-out evaluation", "error",
                  title=f"runs of {deployment.prefix} ({deployment.region})")  # fmt: skip
    for run in runs:
        table.add_row(*_summary_cells(run))
    out.print(table)
    if not runs:
        out.print("no runs yet: `mtrl submit FILE` starts one", highlight=False)


def _summary_cells(run: RunSummary) -> list[str]:
    deadline = "—" if run.deadline_in_hours is None else _hours(run.deadline_in_hours)
    return [
        run.run_id,
        run.status,
        run.config,
        _hours(run.elapsed_hours),
        f"${run.spent_usd:,.0f} (${run.cost_per_hour:,.0f}/h)",
        deadline,
        run.evaluation or "",
        run.error or "",
    ]


def _hours(hours: float) -> str:
    sign = "-" if hours < 0 else ""
    minutes = int(abs(hours) * 60)
    return f"{sign}{minutes // 60}h{minutes % 60:02d}m"


def status_command(
    run_id: Annotated[str, typer.Argument(help="The run id (`mtrl runs` lists them).")],
    watch: Annotated[
        float | None,
        typer.Option(
            help="Refresh every SECONDS until the run ends (Ctrl-C stops watching).",
            min=1.0,
            metavar="SECONDS",
        ),
    ] = None,
    prefix: Prefix = None,
    profile: Profile = None,
    region: Region = None,
    as_json: AsJson = False,
) -> None:
    """One run: pipeline state, training step and reward, queues, workers, GPUs, cost, deadline."""
    session, deployment = deployed(prefix, profile, region)
    clients = {name: session.client(name) for name in STATUS_SERVICES}
    try:
        while True:
            status = _status(clients, deployment, run_id)
            if as_json:
                out.print_json(json.dumps(status.as_dict()))
            else:
                _print_status(status)
            if watch is None or status.execution not in (None, "RUNNING"):
                return
            time.sleep(watch)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _status(clients: dict[str, Any], deployment: Deployment, run_id: str) -> RunDetails:
    try:
        return run_status(clients, deployment, run_id, now=time.time())
    except UnknownRun as error:
        raise fail(str(error), code=1) from None
    except (ClientError, BotoCoreError) as error:
        raise aws_failure(error) from None


def _print_status(status: RunDetails) -> None:
    run = status.summary
    table = Table(show_header=False, title=f"run {run.run_id}")
    rows = {
        "status": run.status,
        "execution": f"{status.execution or 'not started'}" + (f" in {status.state}" if status.state else ""),
        "training": _training_line(status),
        "queues": "\n".join(_queue_line(q) for q in status.queues) or "none",
        "reward workers": "none" if status.workers is None else f"{status.workers[0]} running of {status.workers[1]}",
        "GPU nodes": "unknown" if status.gpu_nodes is None else str(status.gpu_nodes),
        "elapsed": _hours(run.elapsed_hours),
        "cost so far": f"${run.spent_usd:,.0f} at ${run.cost_per_hour:,.0f}/h",
        "deadline in": "—" if run.deadline_in_hours is None else _hours(run.deadline_in_hours),
    }  # fmt: skip
    if status.checkpoints:
        rows["checkpoints"] = "\n".join(_checkpoint_line(c) for c in status.checkpoints)
    if run.evaluation:
        rows["held-out evaluation"] = run.evaluation
    if status.health_figures:
        rows["last step"] = _figures_line(status.health_figures)
    if status.update:
        rows["last update"] = ", ".join(
            f"{name.replace('_', ' ')} {value:.3g}" for name, value in status.update.items()
        )
    if run.health:
        rows["run health"] = "\n".join(run.health)
    if status.notes:
        rows["notes"] = "\n".join(status.notes)
    if run.error:
        rows["error"] = run.error
    for key, value in rows.items():
        table.add_row(key, value)
    out.print(table)


def _checkpoint_line(checkpoint: dict[str, Any]) -> str:
    step = f" (step {checkpoint['step']})" if checkpoint.get("step") is not None else ""
    where = checkpoint["uri"] or f"location unknown, see {checkpoint['manifest']}"
    return f"{checkpoint['name']}{step}: {where}"


def _training_line(status: RunDetails) -> str:
    if status.step is None:
        return "no step yet"
    line = f"step {status.step}"
    if status.mean_reward is not None:
        line += f", mean reward {status.mean_reward:.3f}"
    if status.pass_rate is not None:
        line += f", pass rate {status.pass_rate:.0%}"
    return line


def _figures_line(figures: dict[str, float]) -> str:
    """The last step's run-health metrics: shares as percentages, the others as numbers."""
    return ", ".join(
        f"{metric.replace('_', ' ')} {value:.0%}"
        if metric in SHARES
        else f"{metric.replace('_', ' ')} {value:.3g}"
        for metric, value in figures.items()
    )


def _queue_line(queue: QueueDepth) -> str:
    age = "" if queue.oldest_seconds is None else f", oldest {queue.oldest_seconds:.0f}s"
    return f"{queue.kind}: {queue.waiting} waiting, {queue.in_flight} in flight{age}"


def cost_command(
    run_id: Annotated[
        str | None, typer.Argument(help="A run: what it has cost so far (needs the deployment).")
    ] = None,
    config: ConfigName = None,
    prefix: Prefix = None,
    profile: Profile = None,
    region: Region = None,
    as_json: AsJson = False,
) -> None:
    """What a config costs per hour and at most per run (offline), or what a run has cost so far."""
    if run_id is not None:
        session, deployment = deployed(prefix, profile, region)
        try:
            run = RunStore(session.client("dynamodb"), deployment.runs_table).get(run_id)
        except (ClientError, BotoCoreError) as error:
            raise aws_failure(error) from None
        if run is None:
            raise fail(
                f"no run {run_id} in deployment {deployment.prefix}: `mtrl runs` lists them", code=1
            )
        spent = summarize(run, now=time.time())
        try:
            tokens = billed_tokens(session.client("s3"), run)
        except (ClientError, BotoCoreError) as error:
            raise aws_failure(error) from None
        if as_json:
            out.print_json(json.dumps(asdict(spent) | {"billable_token_usage": tokens}))
            return
        out.print(
            f"run {run_id}: ${spent.spent_usd:,.0f} so far over {_hours(spent.elapsed_hours)} "
            f"at ${spent.cost_per_hour:,.0f}/h",
            highlight=False,
        )
        if tokens:
            counts = ", ".join(f"{count:,} {kind.removesuffix('TokenCount').lower()}"
                               for kind, count in tokens.items())  # fmt: skip
            out.print(
                f"  tokens SageMaker billed its managed job: {counts} (AWS publishes no "
                "per-token price this project found: not in the figure above)",
                highlight=False,
                soft_wrap=True,
            )
        return
    try:
        cost = estimate(load_training_config(config or DEFAULT_CONFIG))
    except TrainingConfigError as error:
        raise fail(str(error)) from None
    if as_json:
        out.print_json(json.dumps({"config": config or DEFAULT_CONFIG, **asdict(cost),
                                   "per_hour": cost.per_hour, "run_at_most": cost.run_at_most,
                                   "within_budget": cost.within_budget}))  # fmt: skip
        return
    out.print(f"{config or DEFAULT_CONFIG}: {cost.describe()}", highlight=False, soft_wrap=True)


def teardown_command(
    run_id: Annotated[str | None, typer.Argument(help="The run to stop and tear down now.")] = None,
    all_idle: Annotated[
        bool, typer.Option("--all-idle", help="Scale GPU nodes no run holds to zero now.")
    ] = False,
    prefix: Prefix = None,
    profile: Profile = None,
    region: Region = None,
    as_json: AsJson = False,
) -> None:
    """Stop a run and delete everything it created (idempotent), or release idle GPU nodes."""
    if (run_id is None) == (not all_idle):
        raise fail("give a run id (`mtrl teardown RUN`) or --all-idle, not both")
    session, deployment = deployed(prefix, profile, region)
    lambda_client = session.client("lambda")

    def work() -> tuple[dict[str, Any], str]:
        if all_idle:
            released = release_idle_nodes(lambda_client, deployment)
            message = (
                "idle GPU nodes scaled to zero" if released else "no idle GPU nodes to release"
            )
            return {"released_idle": released}, message
        reaped = teardown_run(lambda_client, deployment, run_id or "")
        return reaped.model_dump(mode="json"), (
            f"run {run_id} torn down: {reaped.workers_stopped} workers stopped, "
            f"{reaped.job_objects_deleted} job objects deleted, "
            f"{reaped.queues_deleted} queues deleted, {reaped.leftover} left"
        )

    apply_change(work, refusals=(TeardownFailed,), as_json=as_json)


def logs_command(
    run_id: Annotated[str, typer.Argument(help="The run id (`mtrl runs` lists them).")],
    plane: Annotated[
        str, typer.Option(help="pipeline (Step Functions and Lambdas), workers or trainer.")
    ] = "pipeline",
    since: Annotated[float, typer.Option(help="Hours back to start from.", min=0.0)] = 24.0,
    follow_: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")
    ] = False,
    prefix: Prefix = None,
    profile: Profile = None,
    region: Region = None,
) -> None:
    """A run's log lines from the CloudWatch log groups of one plane, oldest first."""
    if plane not in Plane.__args__:  # type: ignore[attr-defined]
        raise fail(f"--plane {plane}: use pipeline, workers or trainer")
    session, deployment = deployed(prefix, profile, region)
    try:
        wanted = sources(deployment, run_id, plane)  # type: ignore[arg-type]
    except DeploymentError as error:
        raise fail(str(error)) from None
    client = session.client("logs")
    since_ms = int((time.time() - since * 3600) * 1000)
    try:
        lines = (
            follow(client, wanted, since_ms=since_ms, sleep=time.sleep)
            if follow_
            else iter(read(client, wanted, since_ms=since_ms))
        )
        for line in lines:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(line.timestamp / 1000))
            out.print(f"{stamp} {line.message}", highlight=False, markup=False, soft_wrap=True)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except (ClientError, BotoCoreError) as error:
        raise aws_failure(error) from None
