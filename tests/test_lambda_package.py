"""What the deployed functions import is in their asset or in the Lambda runtime: each handler
module is imported from a copy of the packaged source alone (site hooks off, so the editable
install cannot help), and every third-party module it pulls in must come from REQUIREMENTS
(or their dependencies) or boto3, which the runtime provides."""

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

from stacks.components.lambda_code import _IGNORED, PACKAGES, PROJECT_ROOT, REQUIREMENTS
from tests.conftest import Synthesized

RUNTIME_PROVIDED = ("boto3",)  # and its dependencies


def _with_dependencies(names: tuple[str, ...]) -> set[str]:
    """Distribution names, normalized, with their (non-extra) requirements, recursively."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = re.split(r"[=<>!~;\[ ]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for requirement in distribution(name).requires or []:
            if "extra ==" not in requirement:
                todo.append(requirement)
    return seen


def _handler_modules(app: Synthesized) -> set[str]:
    handlers = {
        resource["Properties"]["Handler"]
        for template in app.templates.values()
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::Lambda::Function"
        and "Code" in resource["Properties"]
        and "S3Key" in resource["Properties"]["Code"]
        and resource["Properties"].get("Handler", "").startswith(PACKAGES)
    }
    return {handler.rsplit(".", 1)[0] for handler in handlers}


def test_handlers_import_with_only_the_asset_and_the_runtime(
    default_app: Synthesized, tmp_path: Path
) -> None:
    modules = _handler_modules(default_app)
    assert {
        "lambdas.pipeline.handlers",
        "lambdas.router.proxy",
        "lambdas.kubernetes.bootstrap",
        "lambdas.kubernetes.chart_install",
    } <= modules
    for package in PACKAGES:
        shutil.copytree(PROJECT_ROOT / package, tmp_path / package, ignore=_IGNORED)
    site = sysconfig.get_paths()["purelib"]
    # Top-level modules loaded from site-packages (the rest is the standard library or ours).
    script = (
        f"import sys, json\nfor m in {sorted(modules)!r}: __import__(m)\n"
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
    imported = set(json.loads(result.stdout.splitlines()[-1]))
    # botocore tries certifi for its CA bundle and falls back to its own when it is missing.
    third_party = imported - set(PACKAGES) - {"certifi"}
    allowed = _with_dependencies(REQUIREMENTS + RUNTIME_PROVIDED)
    owners = packages_distributions()
    for module in sorted(third_party):
        owner = {name.lower().replace("_", "-") for name in owners.get(module, [module])}
        assert owner & allowed, f"{module} (from {owner}) is neither packaged nor in the runtime"


def test_the_asset_pins_what_pyproject_pins() -> None:
    """The Lambda asset is installed from REQUIREMENTS: the same versions the project runs with."""
    pinned = {
        re.split(r"==", requirement)[0].lower(): requirement.lower()
        for requirement in tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"][
            "dependencies"
        ]
    }
    for requirement in REQUIREMENTS:
        name = requirement.split("==")[0].lower()
        assert pinned.get(name) == requirement.lower(), (
            f"{requirement} vs pyproject {pinned.get(name)}"
        )
