"""The compute planes in local mode, behind the pipeline's interfaces (domain/backends.py).

- `LocalRewardFleet`: reward workers as local processes running the real worker
  (`python -m reward_envs.worker`), pointed at the run's queues and the local router.
- `LocalTrainingCluster`: the training job, and each evaluation, as a trainer process — the
  local policy's (`python -m local_trainer`) or the open-weights trainer's with a real
  language model (`python -m llm_trainer`), as `TrainerProgram` says; scaling nodes up and
  down is a no-op, still recorded.

Both keep what they did in `events` (for the run report) and stop their processes on request;
`alive()` says how many of their processes are still running (0 after teardown).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from domain.backends import (
    JobStatus,
    Phase,
    RewardFleet,
    RunContext,
    TrainingCluster,
    worker_environment,
)
from domain.episodes import EvaluationStage
from domain.trainer_job import JOB_VARIABLE, TrainingJob
from mtrl.local.waits import PlaneChanges
from reward_envs.registry import load

STOP_GRACE_SECONDS = 10.0
TRAINER = "trainer"  # the training job's name beside the evaluations' (their stage)


@dataclass
class _Process:
    popen: subprocess.Popen
    log: Path

    @property
    def running(self) -> bool:
        return self.popen.poll() is None

    def last_error_line(self) -> str:
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line]
        except OSError:
            return ""
        return lines[-1] if lines else ""


def _stop_all(processes: list[_Process], grace: float) -> int:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL; returns how many were running."""
    running = [p for p in processes if p.running]
    for process in running:
        process.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in running:
        try:
            process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait()
    return len(running)


@dataclass
class _Recorder:
    changes: PlaneChanges
    events: list[dict[str, Any]] = field(default_factory=list)

    def record(self, action: str, run: RunContext, **details: Any) -> None:
        self.events.append({"action": action, "run_id": run.run_id, "at": time.time(), **details})
        self.changes.changed()


class LocalRewardFleet(RewardFleet):
    def __init__(
        self, *, environment: dict[str, str], log_dir: Path, changes: PlaneChanges
    ) -> None:
        """Logs go to `<log_dir>/<run id>/logs/`; what it does is told to `changes`."""
        self._environment = environment
        self._log_dir = log_dir
        self._workers: dict[str, list[_Process]] = defaultdict(list)
        self._recorder = _Recorder(changes)
        self.events = self._recorder.events

    def start(self, run: RunContext, *, workers: int) -> list[str]:
        existing = self._workers[run.run_id]
        for index in range(len(existing), workers):
            log = self._log_dir / run.run_id / "logs" / f"worker-{index}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("ab") as sink:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "reward_envs.worker"],
                    env=self._worker_environment(run),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            existing.append(_Process(popen, log))
        self._recorder.record("start_workers", run, workers=workers)
        return [f"{run.run_id}-worker-{i}" for i in range(len(existing))]

    def healthy(self, run: RunContext) -> int:
        return sum(1 for process in self._workers.get(run.run_id, []) if process.running)

    def stop(self, run: RunContext) -> int:
        stopped = _stop_all(self._workers.get(run.run_id, []), STOP_GRACE_SECONDS)
        self._recorder.record("stop_workers", run, stopped=stopped)
        return stopped

    def alive(self) -> int:
        return sum(p.running for processes in self._workers.values() for p in processes)

    def kill_all(self) -> int:
        return _stop_all([p for ps in self._workers.values() for p in ps], grace=0.0)

    def _worker_environment(self, run: RunContext) -> dict[str, str]:
        local = {
            "MTRL_RUN_TOKEN": run.run_token,  # a local process: its environment is private
            "MTRL_WAIT_SECONDS": "1",
            "MTRL_SHUTDOWN_GRACE_SECONDS": "2",
        }
        return {**os.environ, **self._environment, **worker_environment(run), **local}


def _process_status(process: _Process | None, what: str, *, step: int | None = None) -> JobStatus:
    if process is None:
        return JobStatus(Phase.PENDING, "not submitted")
    code = process.popen.poll()
    if code is None:
        return JobStatus(Phase.RUNNING, step=step)
    if code == 0:
        return JobStatus(Phase.SUCCEEDED, step=step)
    reason = process.last_error_line() or f"exit code {code}"
    return JobStatus(Phase.FAILED, f"{what} exited with code {code}: {reason}", step=step)


@dataclass(frozen=True)
class TrainerProgram:
    """What a local training cluster runs: the trainer's module, and for the open-weights
    trainer the model it loads (`TrainingJob.model_source`) and how many processes train it
    together (under torchrun, as on a node's GPUs; here on the CPU)."""

    module: str = "local_trainer"
    model_source: str | None = None
    processes: int = 1

    def command(self) -> list[str]:
        if self.processes == 1:
            return [sys.executable, "-m", self.module]
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={self.processes}", "-m", self.module,
        ]  # fmt: skip


LOCAL_POLICY = TrainerProgram()


def language_model_trainer(model_source: str, *, processes: int = 1) -> TrainerProgram:
    return TrainerProgram(module="llm_trainer", model_source=model_source, processes=processes)


class LocalTrainingCluster(TrainingCluster):
    def __init__(
        self,
        *,
        environment: dict[str, str],
        log_dir: Path,
        changes: PlaneChanges,
        seed: int = 0,
        program: TrainerProgram = LOCAL_POLICY,
    ) -> None:
        """What it does, and each line and end of its processes, is told to `changes`."""
        self._environment = environment
        self._program = program
        self._log_dir = log_dir
        self._seed = seed
        self._nodes: dict[str, int] = {}
        self._jobs: dict[tuple[str, str], _Process] = {}  # (run id, trainer or stage)
        self._lock = threading.Lock()
        self.progress: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._changes = changes
        self._recorder = _Recorder(changes)
        self.events = self._recorder.events

    def scale_up(self, run: RunContext, *, instances: int) -> None:
        self._nodes[run.run_id] = instances
        self._recorder.record("scale_up", run, instances=instances)

    def nodes_ready(self, run: RunContext) -> int:
        return self._nodes.get(run.run_id, 0)

    def submit(self, run: RunContext) -> str:
        return self._launch(run, evaluation=None)

    def status(self, run: RunContext) -> JobStatus:
        process = self._jobs.get((run.run_id, TRAINER))
        with self._lock:
            steps = [entry["step"] for entry in self.progress[run.run_id] if "step" in entry]
        return _process_status(process, "trainer", step=steps[-1] if steps else None)

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        return self._launch(run, evaluation=stage)

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        return _process_status(self._jobs.get((run.run_id, stage)), f"{stage} evaluation")

    def delete(self, run: RunContext) -> int:
        processes = [p for (run_id, _), p in self._jobs.items() if run_id == run.run_id]
        if not processes:
            return 0
        _stop_all(processes, STOP_GRACE_SECONDS)
        self._recorder.record("delete_job", run)
        return len(processes)

    def _launch(self, run: RunContext, *, evaluation: EvaluationStage | None) -> str:
        """The trainer process, training or (with `evaluation`) evaluating; once per run and job."""
        name = evaluation or TRAINER
        job_id = f"{run.run_id}-{name}"
        if (run.run_id, name) in self._jobs:
            return job_id
        environment = load(run.training.environment, **run.training.environment_args)
        job = TrainingJob.for_run(
            run,
            evaluation=evaluation,
            model_source=self._program.model_source,
            reward_range=(environment.reward_range.low, environment.reward_range.high),
            seed=self._seed,
        )
        log = self._log_dir / run.run_id / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as sink:
            popen = subprocess.Popen(
                self._program.command(),
                env={**os.environ, **self._environment, JOB_VARIABLE: job.model_dump_json()},
                stdout=subprocess.PIPE,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        self._jobs[(run.run_id, name)] = _Process(popen, log)
        threading.Thread(
            target=self._follow, args=(run.run_id, popen), name=f"{name}-output", daemon=True
        ).start()
        if evaluation:
            self._recorder.record("submit_evaluation", run, job=job_id, stage=str(evaluation))
        else:
            self._recorder.record("submit", run, job=job_id)
        return job_id

    def scale_down(self, run: RunContext) -> None:
        self._nodes.pop(run.run_id, None)
        self._recorder.record("scale_down", run)

    def release_idle(self, *, immediately: bool = False) -> bool:
        return False  # local nodes are never kept warm: scale_down releases them at once

    def alive(self) -> int:
        return sum(process.running for process in self._jobs.values())

    def kill_all(self) -> int:
        return _stop_all(list(self._jobs.values()), grace=0.0)

    def _follow(self, run_id: str, popen: subprocess.Popen) -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self._lock:
                self.progress[run_id].append(entry)
            self._changes.changed()
        popen.wait()  # ended: its status says so from now on
        self._changes.changed()
