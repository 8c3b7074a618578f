"""Each benchmark runs, in its quick mode (`BENCH_QUICK=1`: seconds, no figure kept), so a change
that breaks one fails here instead of rotting unseen until the next measurement. Their figures
are not asserted: they are measurements (bench/). `bench.synth`'s quick mode synthesizes once and
leaves `make test` untimed (this is `make test`); `bench.local`'s plays one training step without
evaluations. `bench.mutate`'s bookkeeping has its own tests (tests/bench/test_mutate.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
RESULTS = ROOT / "bench" / "results"

# Each benchmark and a line its report always prints.
QUICK = {
    "bench.envs": "solver: mean guesses",
    "bench.trajectories": "peak traced memory",
    "bench.validate": "records:",
    "bench.router": "added latency per turn",
    "bench.llm_trainer": "weight sync",
    "bench.gpu_check": "GRPO step (chunked)",
    "bench.synth": "cold synth (app.py",
    "bench.local": "per model turn (median)",
}


@pytest.mark.parametrize("module", QUICK)
def test_the_benchmark_runs_in_its_quick_mode(module: str) -> None:
    kept = {path: path.stat().st_mtime_ns for path in RESULTS.iterdir()}
    done = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "BENCH_QUICK": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert QUICK[module] in done.stdout, done.stdout
    assert {path: path.stat().st_mtime_ns for path in RESULTS.iterdir()} == kept
