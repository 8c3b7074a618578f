"""The repository as the stacks' assets see it: its root, and asset contents limited to named
folders of it."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from constructs import Construct

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def only_folders(folders: Iterable[str]) -> list[str]:
    """An asset's exclude patterns that keep `folders` of the repository root and nothing else
    (CDK's ignore patterns honour `!`): local folders (build/, runs/, caches) then neither
    bloat the asset nor change its hash."""
    kept = tuple(folders)
    return ["*", *(f"!{folder}" for folder in kept), *(f"!{folder}/**" for folder in kept)]


def project_image(
    scope: Construct, construct_id: str, *, dockerfile: str, folders: Iterable[str]
) -> ecr_assets.DockerImageAsset:
    """A linux/amd64 image `cdk deploy` builds from `dockerfile`, its context the repository's
    `folders` and nothing else (no caches)."""
    return ecr_assets.DockerImageAsset(
        scope,
        construct_id,
        directory=str(PROJECT_ROOT),
        file=dockerfile,
        exclude=[*only_folders(folders), "**/__pycache__"],
        platform=ecr_assets.Platform.LINUX_AMD64,
    )


def pinned(*distributions: str) -> tuple[str, ...]:
    """`name==version` for each of `distributions` as the project's own dependencies pin it
    (pyproject.toml), so that an asset's requirements never drift from what the tests ran."""
    with (PROJECT_ROOT / "pyproject.toml").open("rb") as stream:
        dependencies = tomllib.load(stream)["project"]["dependencies"]
    pins = {re.split(r"[=<>!~\[ ]", pin, maxsplit=1)[0].lower(): pin for pin in dependencies}
    missing = [name for name in distributions if name.lower() not in pins]
    if missing:
        raise LookupError(f"pyproject.toml's dependencies pin no {', '.join(missing)}")
    return tuple(pins[name.lower()] for name in distributions)
