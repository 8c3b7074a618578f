"""`--dist loadgroup` (pyproject's addopts) keeps tests marked with one `xdist_group` on one
worker: the IAM proof (tests/iam/) builds its deployed world once per worker that draws one of
its tests, about a minute each. pytest 9.2.0 with pytest-xdist 3.8.0 silently stopped grouping
(pytest-dev/pytest-xdist#1386: xdist marks groups by rewriting node ids, which pytest 9.2 no
longer reads), so the pins are checked here on a small suite in a pytest of their own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = 'import pytest\n\npytestmark = pytest.mark.xdist_group("shared")\n'


def test_grouped_tests_run_on_one_worker(tmp_path: Path) -> None:
    for name in ("a", "b"):
        tests = "".join(f"\n\ndef test_{name}_{n}():\n    pass\n" for n in range(4))
        (tmp_path / f"test_{name}.py").write_text(GROUPED + tests)
    free = "".join(f"\n\ndef test_free_{n}():\n    pass\n" for n in range(8))
    (tmp_path / "test_free.py").write_text(free)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-v", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    ran = re.findall(r"^\[(gw\d)\] .*PASSED .*::(test_\w+)", done.stdout, re.MULTILINE)
    grouped = {worker for worker, test in ran if not test.startswith("test_free")}
    assert len(ran) == 16 and len(grouped) == 1, done.stdout[-2000:]
