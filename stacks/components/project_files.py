"""The repository as the stacks' assets see it: its root, and asset contents limited to named
folders of it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def only_folders(folders: Iterable[str]) -> list[str]:
    """An asset's exclude patterns that keep `folders` of the repository root and nothing else
    (CDK's ignore patterns honour `!`): local folders (build/, runs/, caches) then neither
    bloat the asset nor change its hash."""
    kept = tuple(folders)
    return ["*", *(f"!{folder}" for folder in kept), *(f"!{folder}/**" for folder in kept)]
