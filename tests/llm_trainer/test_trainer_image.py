"""The open-weights trainer image, checked without Docker: stages, user, entry point, what it
carries of ours, and that its pins are the ones the CPU tests run."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from stacks.components.project_files import PROJECT_ROOT
from stacks.components.trainer_image import BUILD_CONTEXT, TRAINER_DOCKERFILE
from tests.conftest import Synthesized
from tests.packaging import pyproject_pins, third_party_imports, with_dependencies
from tests.test_reward_fleet import docker_image

DOCKERFILE = (PROJECT_ROOT / TRAINER_DOCKERFILE).read_text()
REQUIREMENTS_FILE = "llm_trainer/requirements.txt"


def _requirements() -> tuple[str, ...]:
    lines = (PROJECT_ROOT / REQUIREMENTS_FILE).read_text().splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _final_stage() -> str:
    return DOCKERFILE[DOCKERFILE.rindex("\nFROM ") :]


def test_final_stage_is_slim_non_root_and_runs_the_trainer() -> None:
    final = _final_stage()
    assert re.search(r"FROM \S+python:3\.12-slim\s", final)
    (user,) = re.findall(r"^USER (\S+)$", final, re.MULTILINE)
    assert user not in ("root", "0")
    assert not re.search(r"apt-get|gcc|build-essential|pip install", final)
    (entry,) = re.findall(r"^ENTRYPOINT (.+)$", DOCKERFILE, re.MULTILINE)
    assert entry == '["python", "-m", "llm_trainer"]'


def _imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def _direct_imports(packages: tuple[str, ...]) -> set[str]:
    """Top-level third-party modules imported (inside functions too) by the trainer's modules
    and every module of ours they import, transitively."""
    todo = [p for p in (PROJECT_ROOT / "llm_trainer").rglob("*.py")]
    seen: set[Path] = set()
    third_party: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imports_of(path):
            top = module.split(".")[0]
            if top not in packages:
                third_party.add(top)
                continue
            base = PROJECT_ROOT / Path(*module.split("."))
            todo += [c for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()]
    return third_party - set(sys.stdlib_module_names) - {"__future__"}


def test_the_image_carries_what_the_trainer_imports(tmp_path: Path) -> None:
    """The trainer runs from the copied packages alone (nothing of `mtrl`, `reward_envs`, the
    stacks or the Lambdas), and every library our code imports is pinned in the image."""
    copies = re.findall(r"^COPY (\w+) /opt/trainer/(\w+)$", _final_stage(), re.MULTILINE)
    packages = tuple(source for source, target in copies if source == target)
    assert set(packages) == set(BUILD_CONTEXT) == {"domain", "training_configs", "llm_trainer"}
    assert f"COPY {REQUIREMENTS_FILE} " in DOCKERFILE
    imported = third_party_imports(
        packages, {"llm_trainer.__main__", "llm_trainer.trainer", "llm_trainer.tiny"}, tmp_path,
        # The model as a run loads it, LoRA (PEFT) included.
        code="from llm_trainer.tiny import tiny_tokenizer, tiny_model; import peft\n"
        "peft.get_peft_model(tiny_model(tiny_tokenizer()), peft.LoraConfig(target_modules='all-linear'))",
    )  # fmt: skip
    assert {"torch", "transformers", "peft", "boto3", "pydantic", "numpy"} <= imported
    # What the requirements install: vLLM itself (llm_trainer/vllm_generator.py), and the rest
    # with their dependencies (vLLM's are not resolvable here: it is not installed).
    installed = with_dependencies(tuple(r for r in _requirements() if not r.startswith("vllm==")))
    installed |= {r.split("==")[0] for r in _requirements() if r.startswith("vllm==")}
    assert "vllm" in installed
    distributions = packages_distributions()
    for module in sorted(_direct_imports(packages)):
        owners = {name.lower().replace("_", "-") for name in distributions.get(module, [module])}
        assert owners & installed, (
            f"{module} ({owners}) is imported but not installed by {REQUIREMENTS_FILE}"
        )


def test_the_image_pins_what_the_project_pins() -> None:
    pinned = pyproject_pins()
    extras = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    pinned |= {r.split("==")[0].lower(): r.lower() for r in extras["llm"]}
    requirements = _requirements()
    for requirement in requirements:
        name = requirement.split("==")[0].lower()
        if name != "vllm":
            assert pinned.get(name) == requirement.lower(), requirement
    assert {r.split("==")[0] for r in requirements} >= {"torch", "transformers", "peft", "vllm"}


def test_cdk_deploy_builds_it_from_only_what_the_dockerfile_copies(
    default_app: Synthesized,
) -> None:
    image = docker_image(default_app, TRAINER_DOCKERFILE)
    assert image["source"]["platform"] == "linux/amd64"
    context = default_app.outdir / image["source"]["directory"]
    assert sorted(entry.name for entry in context.iterdir()) == sorted(BUILD_CONTEXT)
    assert not list(context.rglob("__pycache__"))
