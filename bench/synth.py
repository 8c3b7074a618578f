"""Times a cold `cdk synth` (app.py in a new process, cdk-nag included) and `make test` as CI
runs it: on a fresh clone of HEAD (committed work only), install included.

Prints a table with the machine's core count; the design's targets (DESIGN.md section 9) are
<= 15 s for a cold synth and <= 10 min for `make test` on a fresh clone, install included (the
clone installs from the package caches this machine has, as CI on it does).
`BENCH_QUICK=1` (as `make test` runs it, so it cannot time itself): one synth without Lambda
bundling, no `make test`. Nothing here is asserted: it is a measurement, not a test.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stacks.config import deployment_context

ROOT = Path(__file__).resolve().parent.parent
QUICK = os.environ.get("BENCH_QUICK") == "1"


def timed(command: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def fresh_clone_make_test() -> list[tuple[str, str, str]]:
    """`make install`, then the rest of `make test` (lint, the llm extra, pytest, the bundling
    synth and the scan), in a new clone of this repository's HEAD."""
    with tempfile.TemporaryDirectory(prefix="mtrl-clone-") as scratch:
        clone = Path(scratch) / "nova-mtrl"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        install = timed(["make", "install"], cwd=clone)
        rest = timed(["make", "test"], cwd=clone)
    return [
        ("fresh clone: make install", f"{install:.0f} s", ""),
        ("fresh clone: the rest of make test", f"{rest:.0f} s", ""),
        ("fresh clone: make test in all", f"{install + rest:.0f} s", "<= 600 s incl. install"),
    ]


def main() -> int:
    runs = 1 if QUICK else int(os.environ.get("BENCH_SYNTH_RUNS", "3"))
    synth_times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as outdir:
            env = {**os.environ, "CDK_OUTDIR": outdir}
            env.pop("CDK_CONTEXT_JSON", None)
            if QUICK:
                # Every stack, without Lambda bundling (as the tests synthesize).
                env["CDK_CONTEXT_JSON"] = json.dumps(
                    deployment_context({"aws:cdk:bundling-stacks": []})
                )
            synth_times.append(timed([sys.executable, "app.py"], env))
    bundling = "no Lambda bundling" if QUICK else "Lambda bundling"
    rows = [
        (
            f"cold synth (app.py, every stack, cdk-nag, {bundling})",
            f"median {statistics.median(synth_times):.1f} s of {runs}",
            "<= 15 s",
        ),
    ]
    if not QUICK:
        rows += fresh_clone_make_test()
    print(f"nova-mtrl synth bench — {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    width = max(len(name) for name, _, _ in rows)
    print(f"{'what':<{width}}  {'measured':<24}  target")
    for name, measured, target in rows:
        print(f"{name:<{width}}  {measured:<24}  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
