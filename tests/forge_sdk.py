"""The installed Nova Forge SDK (amzn-nova-forge 1.4.10) read as source: its package needs
Python 3.12 and the SageMaker SDK, so tests read its files, and compile the self-contained
functions they run as oracles."""

from __future__ import annotations

import ast
from importlib.metadata import distribution
from pathlib import Path


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
