"""The reward-worker image, checked without Docker: stages, user, entry point, and that it
carries what the worker runs and nothing else of ours."""

from __future__ import annotations

import re
from pathlib import Path

from stacks.components.project_files import PROJECT_ROOT
from stacks.components.reward_fleet import WORKER_DOCKERFILE
from tests.packaging import (
    OPTIONAL_IMPORTS,
    assert_installed,
    pyproject_pins,
    third_party_imports,
)

DOCKERFILE = (PROJECT_ROOT / WORKER_DOCKERFILE).read_text()
REQUIREMENTS_FILE = "reward_envs/worker/requirements.txt"


def _requirements() -> tuple[str, ...]:
    lines = (PROJECT_ROOT / REQUIREMENTS_FILE).read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _packages() -> tuple[str, ...]:
    """Our packages the final stage copies in, as `COPY <package> /opt/worker/<package>`."""
    copies = re.findall(r"^COPY (\w+) /opt/worker/(\w+)$", _final_stage(), re.MULTILINE)
    assert all(source == target for source, target in copies)
    return tuple(source for source, _ in copies)


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


def test_the_image_carries_what_the_worker_and_its_environments_import(tmp_path: Path) -> None:
    """The entry module and every built-in environment import from the copied packages and the
    installed requirements alone; the CLI, the stacks, the Lambdas stay out."""
    packages = _packages()
    assert set(packages) == {"domain", "reward_envs"}
    assert f"COPY {REQUIREMENTS_FILE} " in DOCKERFILE
    # The built-in environments: what the registry knows in a fresh process (OpenEnv's needs
    # its server's address; it connects only when an episode starts).
    load_all = (
        "from reward_envs.registry import load, registered\n"
        "arguments = {'openenv': {'url': 'http://localhost:8000'}}\n"
        "for name in registered(): load(name, **arguments.get(name, {}))"
    )
    imported = third_party_imports(
        packages, {"reward_envs.worker.__main__"}, tmp_path, code=load_all
    )
    assert {"boto3", "pydantic", "pydantic_settings", "websockets"} <= imported
    assert_installed(imported - OPTIONAL_IMPORTS, _requirements())


def test_the_image_pins_what_pyproject_pins() -> None:
    pinned = pyproject_pins()
    for requirement in _requirements():
        assert pinned.get(requirement.split("==")[0].lower()) == requirement.lower(), requirement
