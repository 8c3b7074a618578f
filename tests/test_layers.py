"""The house's layers: the domain (with the training configs) at the bottom imports nothing
else of ours; the Lambda code and the reward environments sit on it; the stacks on those; the
command line and local mode on top. No top-level package imports one above it, so the
package graph has no cycles, and the Lambda asset needs neither `mtrl` nor `stacks`."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each top-level package and the ones it may import.
MAY_IMPORT = {
    "training_configs": set(),
    "domain": {"training_configs"},
    "lambdas": {"domain", "training_configs"},
    "reward_envs": {"domain", "training_configs"},
    "llm_trainer": {"domain", "training_configs"},
    "local_trainer": {"domain", "training_configs", "reward_envs"},
    "stacks": {"domain", "training_configs", "lambdas"},
    "mtrl": {
        "domain",
        "training_configs",
        "lambdas",
        "reward_envs",
        "llm_trainer",
        "local_trainer",
        "stacks",
    },  # fmt: skip
}


def imports_of(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Top-level packages of ours `package` imports -> where (every import, also in functions)."""
    found: dict[str, set[str]] = {}
    for path in (root / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in MAY_IMPORT and top != package:
                    found.setdefault(top, set()).add(f"{path.relative_to(root)}: {module}")
    return found


def test_no_package_imports_one_above_it() -> None:
    wrong = [
        f"{package} may not import {other}: {sorted(where)}"
        for package, allowed in MAY_IMPORT.items()
        for other, where in imports_of(package).items()
        if other not in allowed
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_package_graph_has_no_cycles() -> None:
    graph = {package: set(imports_of(package)) for package in MAY_IMPORT}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:  # pragma: no cover - the message is the finding
        raise AssertionError(f"import cycle: {error.args[1]}") from None
    assert order.index("training_configs") < order.index("domain") < order.index("mtrl")


def test_the_check_sees_a_wrong_import(tmp_path: Path) -> None:
    """It would notice: a module of the domain that imports the CLI, even inside a function."""
    (tmp_path / "domain").mkdir()
    (tmp_path / "domain" / "bad.py").write_text("def f():\n    from mtrl.cli import app\n")
    assert imports_of("domain", tmp_path) == {"mtrl": {"domain/bad.py: mtrl.cli"}}
