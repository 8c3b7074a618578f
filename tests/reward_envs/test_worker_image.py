"""The reward-worker image, checked without Docker: stages, user, entry point, runtime deps."""

from __future__ import annotations

import re
import subprocess
import sys

from stacks.components.reward_fleet import PROJECT_ROOT, WORKER_DOCKERFILE

DOCKERFILE = (PROJECT_ROOT / WORKER_DOCKERFILE).read_text()


def _final_stage() -> str:
    return DOCKERFILE[DOCKERFILE.rindex("\nFROM ") :]


def test_final_stage_is_slim_non_root_and_without_build_tools() -> None:
    final = _final_stage()
    assert re.search(r"FROM \S+python:3\.12-slim\s", final)
    assert "COPY --from=build /opt/venv /opt/venv" in final
    (user,) = re.findall(r"^USER (\S+)$", final, re.MULTILINE)
    assert user not in ("root", "0")
    assert not re.search(r"apt-get|gcc|build-essential|pip install", final)


def test_entry_point_is_the_worker_module() -> None:
    (entry,) = re.findall(r"^ENTRYPOINT (.+)$", DOCKERFILE, re.MULTILINE)
    assert entry == '["python", "-m", "reward_envs.worker"]'
    assert (PROJECT_ROOT / "reward_envs" / "worker" / "__main__.py").is_file()


def test_the_worker_runtime_does_not_load_the_cdk() -> None:
    probe = "import sys, reward_envs.worker.__main__; print(sorted(m for m in sys.modules if m.startswith(('aws_cdk', 'jsii'))))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
