"""What a deployed artefact (the Lambda asset, the reward-worker image) imports, found without
building it: its modules imported from a copy of our packages it carries alone (site hooks off,
so the editable install cannot help), and the third-party modules that pulls in, checked
against the distributions it installs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

from stacks.components.lambda_code import _IGNORED, PROJECT_ROOT

# Modules our dependencies import only when they are there, and do without: botocore tries
# certifi for its CA bundle; pyarrow pickles with cloudpickle, else with pickle
# (pyarrow/compat.pxi); urllib3 decodes brotli and zstd bodies with brotli or backports.zstd
# (urllib3/response.py, urllib3/util/request.py). The dev environment has them; an artefact
# need not.
OPTIONAL_IMPORTS = frozenset({"certifi", "cloudpickle", "brotli", "_brotli", "backports"})


def with_dependencies(requirements: tuple[str, ...]) -> set[str]:
    """Distribution names, normalized, with their (non-extra) requirements, recursively."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        name = re.split(r"[=<>!~;\[ ]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for requirement in distribution(name).requires or []:
            marker = Requirement(requirement).marker
            # Requirements of extras, or of other platforms (colorama on Windows), are not installed.
            if marker is None or marker.evaluate({"extra": ""}):
                todo.append(requirement)
    return seen


def third_party_imports(
    packages: tuple[str, ...], modules: set[str], tmp_path: Path, *, code: str = ""
) -> set[str]:
    """Top-level third-party modules loaded by importing `modules` (then running `code`) with
    only our `packages` on the path."""
    for package in packages:
        shutil.copytree(PROJECT_ROOT / package, tmp_path / package, ignore=_IGNORED)
    site = sysconfig.get_paths()["purelib"]
    script = (
        f"import sys, json\nfor m in {sorted(modules)!r}: __import__(m)\n{code}\n"
        "print(json.dumps(sorted({n.split('.')[0] for n, m in list(sys.modules.items())"
        f" if (getattr(m, '__file__', None) or '').startswith({site!r})}})))"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{site}", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return set(json.loads(result.stdout.splitlines()[-1])) - set(packages)


def assert_installed(modules: set[str], requirements: tuple[str, ...]) -> None:
    """Each module comes from one of `requirements` or their dependencies."""
    allowed = with_dependencies(requirements)
    owners = packages_distributions()
    for module in sorted(modules):
        owner = {name.lower().replace("_", "-") for name in owners.get(module, [module])}
        assert owner & allowed, f"{module} (from {owner}) is not installed with {requirements}"


def pyproject_pins() -> dict[str, str]:
    """The project's runtime requirements by distribution name (lowercase)."""
    dependencies = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    return {requirement.split("==")[0].lower(): requirement.lower() for requirement in dependencies}
