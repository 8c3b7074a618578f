"""`mtrl local`: one run of the deployed pipeline, on this machine, offline.

What `cdk deploy` ships runs here: the synthesized pipeline stack's state machine and Lambda
handlers (in-process, against moto's server on loopback), the router's proxy and consumer, the
reward workers (local processes) and a real GRPO trainer (a local process) in place of the
HyperPod job. The dataset goes in as an S3 upload matched by the upload rule's own pattern;
the run ends like a deployed one — SUCCEEDED or FAILED, torn down, notified — and leaves a
report under `<out>/<run_id>/`.

Everything that can be wrong with the input is checked before anything is created.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from domain.bucket import EVALUATION_OBJECT, SUMMARY_OBJECT
from domain.checkpoints import referenced_run
from domain.dataset import DatasetValidator
from domain.tracking import tracked_run
from llm_trainer.tiny import TINY
from local_trainer.policy import NoLocalPolicy, policy_for
from mtrl.local.backends import LOCAL_POLICY, TrainerProgram, language_model_trainer
from mtrl.local.embedded import definition_skeleton, fault_states
from mtrl.local.report import failure_reason, write_report
from mtrl.local.session import LocalSession, Observer, Prepared, RunOutcome
from mtrl.local.tracking import TrackingUnavailable, open_store, store_uri, track_locally
from reward_envs.registry import EnvironmentNotFound, load
from training_configs.schema import (
    DEFAULT_CONFIG,
    TrainingConfigError,
    load_training_config,
)


class LocalRunError(ValueError):
    """Bad input for a local run: one line naming the input and the fix. Nothing was created."""


@dataclass(frozen=True)
class LocalRunOptions:
    dataset: Path
    config: str | None = None
    seed: int = 0
    out_dir: Path = Path("runs")
    inject_fault: str | None = None
    max_steps: int | None = None
    # "policy": the small local policy; "llm": the open-weights trainer with `model` (a model
    # directory, a Hugging Face Hub id, or "tiny").
    trainer: str = "policy"
    model: str = TINY
    processes: int = 1  # of the open-weights trainer (torchrun), as on a node's GPUs

    def program(self) -> TrainerProgram:
        if self.trainer != "llm":
            return LOCAL_POLICY
        return language_model_trainer(self.model, processes=self.processes)


def prepare(options: LocalRunOptions) -> Prepared:
    """Check the dataset, the config and that a local policy can train on it."""
    dataset = options.dataset
    if not dataset.is_file():
        raise LocalRunError(f"{dataset}: no such file (give the path of a .jsonl dataset)")
    if dataset.suffix != ".jsonl":
        raise LocalRunError(
            f"{dataset}: the pipeline takes .jsonl uploads only; rename it to {dataset.stem}.jsonl"
        )
    validator = DatasetValidator()
    with dataset.open("rb") as stream:
        found = validator.problems(stream)
        problems = [str(problem) for problem in itertools.islice(found, 3)]
        for _ in found:  # the rest only counted
            pass
    if problems:
        more = validator.summary.problems - len(problems)
        tail = f" (and {more} more; run `mtrl validate {dataset}`)" if more > 0 else ""
        raise LocalRunError(f"{dataset}: invalid dataset: {'; '.join(problems)}{tail}")
    name = options.config or DEFAULT_CONFIG
    try:
        config = load_training_config(name)
    except TrainingConfigError as error:
        raise LocalRunError(str(error)) from None
    if options.max_steps is not None:
        config = config.model_copy(update={"max_steps": options.max_steps})
    try:
        environment = load(config.environment, **config.environment_args)
        if options.trainer == "policy":
            policy_for(environment)
    except (EnvironmentNotFound, NoLocalPolicy) as error:
        raise LocalRunError(f"config {name}: environment: {error}") from None
    if options.trainer == "llm":
        if config.plane == "serverless":
            raise LocalRunError(
                f"config {name}: plane serverless: its managed job is played here by the local "
                "policy; leave out --trainer llm (it trains the HyperPod planes' configs)"
            )
        _check_language_model(options.model)
    base_run = referenced_run(config.base_checkpoint or "")
    if base_run and not (options.out_dir / base_run / "outputs" / SUMMARY_OBJECT).is_file():
        raise LocalRunError(
            f"config {name}: base_checkpoint {config.base_checkpoint}: no local run {base_run} "
            f"with results under {options.out_dir} ({base_run}/outputs/{SUMMARY_OBJECT}); run it "
            "first, or pass --out where it is"
        )
    return Prepared(dataset, validator.summary.records, name, config)


TRAINERS = ("policy", "llm")


def _check_language_model(model: str) -> None:
    """The open-weights trainer can run here: its libraries are installed, its model exists."""
    missing = [name for name in ("torch", "transformers", "peft") if find_spec(name) is None]
    if missing:
        raise LocalRunError(
            f"--trainer llm needs {', '.join(missing)}: pip install -e '.[llm]' (PyTorch, "
            "transformers and PEFT, CPU is enough for --model tiny)"
        )
    if model.startswith("s3://"):
        raise LocalRunError(
            f"--model {model}: a local run cannot read S3; give a model directory, a "
            "Hugging Face Hub id or tiny"
        )
    if model == TINY:
        return
    path = Path(model)
    if path.exists() and not (path / "config.json").is_file():
        raise LocalRunError(
            f"--model {model}: not a model directory (no config.json); give one saved with "
            "save_pretrained, a Hugging Face Hub id, or tiny"
        )
    if not path.exists() and (model.startswith((".", "/", "~")) or model.count("/") != 1):
        raise LocalRunError(
            f"--model {model}: no such directory (and not a Hub id like org/name); give a "
            "model directory, a Hugging Face Hub id, or tiny"
        )


def pipeline_template() -> dict[str, Any]:
    """The pipeline stack's template, synthesized as `cdk deploy` would (without bundling)."""
    import tempfile

    from stacks.app_builder import build_app

    with tempfile.TemporaryDirectory(prefix="mtrl-synth-") as outdir:
        app, config = build_app({"aws:cdk:bundling-stacks": []}, outdir=outdir)
        assembly = app.synth()
        return assembly.get_stack_by_name(f"{config.name_prefix}-pipeline").template


def run_local(
    options: LocalRunOptions,
    *,
    prepared: Prepared | None = None,
    template: dict[str, Any] | None = None,
    observer: Observer | None = None,
    timeout_seconds: float | None = None,
) -> tuple[RunOutcome, Path]:
    """Run the pipeline once on `options.dataset`: how it ended, and the report's directory.
    Raises LocalRunError for bad input, before any run exists. `prepared`: the inputs as
    `prepare(options)` already checked them (a dataset is read once)."""
    prepared = prepared or prepare(options)
    observer = observer or Observer()
    template = template or pipeline_template()
    choices = fault_states(definition_skeleton(template))
    if options.inject_fault and options.inject_fault not in choices:
        raise LocalRunError(
            f"--inject-fault {options.inject_fault}: no such state; choose one of {', '.join(choices)}"
        )
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-store") as background:
        outcome, directory, store = _run(
            options, prepared, template, observer, timeout_seconds, background
        )
        write_report(
            outcome,
            directory,
            track=lambda: track(outcome, options.dataset, directory, options.out_dir, store),
        )
    return outcome, directory


def _run(
    options: LocalRunOptions,
    prepared: Prepared,
    template: dict[str, Any],
    observer: Observer,
    timeout_seconds: float | None,
    background: Executor,
) -> tuple[RunOutcome, Path, Future[Any]]:
    """The run, from deploying to its outputs downloaded; and MLflow's store, opened by
    `background` while the run goes on (MLflow imported, its schema made: seconds of the main
    process, which waits on the run's other processes then)."""
    with LocalSession(
        template, out_dir=options.out_dir, seed=options.seed, trainer=options.program()
    ) as session:
        if options.inject_fault:
            session.inject_fault(options.inject_fault)
        started = time.monotonic()
        base_run = referenced_run(prepared.config.base_checkpoint or "")
        if base_run:  # where a deployment would have it: under runs/<run_id>/ in the bucket
            session.restore_outputs(base_run, options.out_dir / base_run / "outputs")
        run_id, execution = session.upload(prepared)
        store = background.submit(open_store, options.out_dir)
        limit = timeout_seconds or prepared.config.deadline_hours * 3600
        outcome = session.follow(run_id, execution, observer, prepared.config, limit)
        outcome.seconds = time.monotonic() - started
        outcome.config = prepared.config
        directory = options.out_dir / run_id
        session.download_outputs(run_id, directory / "outputs")
    evaluation = directory / "outputs" / EVALUATION_OBJECT
    if evaluation.is_file():
        outcome.evaluation = json.loads(evaluation.read_text())
    return outcome, directory, store


# What of a run's report goes to MLflow as files.
TRACKED_FILES = ("reward_curve.png", f"outputs/{SUMMARY_OBJECT}", f"outputs/{EVALUATION_OBJECT}")


def track(
    outcome: RunOutcome,
    dataset: Path,
    directory: Path,
    out_dir: Path,
    store: Future[Any] | None = None,
) -> str:
    """Log the run to the output folder's MLflow store (`store`: it being opened by `open_store`):
    what the report says it became. A tracking failure never fails the run."""
    if outcome.config is None:
        return "not tracked: the run has no config"
    run = tracked_run(
        run_id=outcome.run_id,
        succeeded=outcome.status == "SUCCEEDED",
        config=outcome.config,
        dataset=str(dataset),
        metrics=outcome.metrics,
        evaluation=outcome.evaluation,
        health=outcome.health,
        reason=failure_reason(outcome),
        artifacts={
            Path(name).name: (directory / name).read_bytes()
            for name in TRACKED_FILES
            if (directory / name).is_file()
        },
    )
    try:
        mlflow_run = track_locally(
            run, out_dir, store=store.result() if store is not None else None
        )
    except TrackingUnavailable as unavailable:
        return f"not tracked: {unavailable}"
    except Exception as error:  # noqa: BLE001 - the run's result stands whatever MLflow does
        logging.getLogger("mtrl.tracking").exception("MLflow tracking failed")
        return f"not tracked: MLflow failed ({type(error).__name__}: {error})"
    return f"MLflow run {mlflow_run} in {store_uri(out_dir)}"
