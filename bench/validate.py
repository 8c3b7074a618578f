"""`mtrl validate` throughput and memory (DESIGN.md section 9: constant memory, >= 50 MB/s).

Writes a dataset of BENCH_VALIDATE_MB megabytes (default 1024; BENCH_QUICK=1: 128) to a
temporary file, runs `mtrl validate` on it in a child process, and prints MB/s and the
child's peak memory. Run: `python -m bench.validate`. Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUICK = os.environ.get("BENCH_QUICK") == "1"


def write_dataset(path: Path, megabytes: int) -> int:
    prompt = "You are playing Wordle. Think briefly, then guess. " * 4
    written = 0
    with path.open("w") as out:
        index = 0
        while written < megabytes * 1_000_000:
            line = (
                json.dumps(
                    {
                        "id": f"r{index}",
                        "metadata": {"prompt": prompt, "answer": "crane", "task": "wordle"},
                    }
                )
                + "\n"
            )
            out.write(line)
            written += len(line)
            index += 1
    return index


def main() -> int:
    megabytes = int(os.environ.get("BENCH_VALIDATE_MB", "128" if QUICK else "1024"))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.jsonl"
        records = write_dataset(path, megabytes)
        size = path.stat().st_size
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "mtrl.cli", "validate", str(path)],
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"nova-mtrl validate bench — {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(
        f"{size / 1e6:,.0f} MB, {records:,} records: {size / 1e6 / seconds:.1f} MB/s (target >= 50), peak memory {peak_mb:.0f} MB, exit {result.returncode}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
