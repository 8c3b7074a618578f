"""The installed Nova Forge SDK (amzn-nova-forge 1.4.10) read as source: its package needs
Python 3.12 and the SageMaker SDK, so tests read its files, and compile the self-contained
functions they run as oracles."""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Callable
from importlib.metadata import distribution
from pathlib import Path
from types import ModuleType
from typing import Any


def sdk_path(path: str) -> Path:
    """A file of the SDK's package (`path` relative to `amzn_nova_forge/`)."""
    return Path(str(distribution("amzn-nova-forge").locate_file(f"amzn_nova_forge/{path}")))


def sdk_source(path: str) -> str:
    return sdk_path(path).read_text(encoding="utf-8")


def sdk_function(path: str, name: str, owner: str | None = None) -> ast.FunctionDef:
    """The SDK's function `name` in `path` (a method of class `owner` if given)."""
    tree: ast.AST = ast.parse(sdk_source(path))
    if owner is not None:
        (tree,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == owner]
    (found,) = [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == name
    ]
    return found


@functools.cache
def sdk_enums() -> ModuleType:
    """The SDK's own enums (core/enums.py, which imports nothing of the SDK)."""
    spec = importlib.util.spec_from_file_location("forge_sdk_enums", sdk_path("core/enums.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sdk_compiled(path: str, name: str, names: dict[str, Any]) -> Callable[..., Any]:
    """The SDK's function `name` of `path`, compiled from its source as it is, with `names` as
    the globals it uses."""
    module = ast.Module(body=[sdk_function(path, name)], type_ignores=[])
    namespace = dict(names)
    exec(compile(module, str(sdk_path(path)), "exec"), namespace)
    return namespace[name]
