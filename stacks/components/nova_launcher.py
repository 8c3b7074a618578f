"""The launcher function of the Nova plane (lambdas/launcher/): AWS's HyperPod CLI, recipes and
helm in a container image built by `cdk deploy` (stacks/assets/launcher/Dockerfile), in the
cluster's network, invoked by the pipeline to start and stop a run's Nova job.

The CLI is the public `release_v2` at a pinned commit, or the Forge bundle a deployment names
(`forge_cli_bundle`): fetched beforehand into `FORGE_CLI_BUNDLE` by `mtrl forge-cli`, and
built only when its files hash to the digest the deployment pins."""

from __future__ import annotations

import hashlib
from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from lambdas.environment import environment_for
from lambdas.launcher.handler import LauncherSettings
from stacks.components.functions import ClusterNetwork, pipeline_function
from stacks.components.lambda_code import REQUIREMENTS
from stacks.components.project_files import PROJECT_ROOT, only_folders
from stacks.config import ConfigError, ForgeCliBundle

DOCKERFILE = "stacks/assets/launcher/Dockerfile"
HANDLER = "lambdas.launcher.handler.launch_job"
# The image's build context: what the Dockerfile copies and nothing else.
BUILD_CONTEXT = ("domain", "lambdas", "training_configs", "stacks/assets/launcher")
# Where a fetched Forge bundle lies, in the build context (its contents are not committed).
FORGE_CLI_BUNDLE = "stacks/assets/launcher/forge-cli/bundle"


def bundle_digest(folder: Path) -> str:
    """The digest of a bundle's files: SHA-256 of `sha256sum`'s lines (`<hex>  <path>`) for
    every file under `folder`, by path in byte order. Again by hand:
    `cd <folder> && find . -type f -printf '%P\\n' | LC_ALL=C sort | xargs -d '\\n' sha256sum
    | sha256sum`."""
    lines = []
    for path in sorted(
        (p for p in folder.rglob("*") if p.is_file()),
        key=lambda p: p.relative_to(folder).as_posix().encode(),
    ):
        content = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{content}  {path.relative_to(folder).as_posix()}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def checked_bundle(bundle: ForgeCliBundle | None, root: Path = PROJECT_ROOT) -> str:
    """The CLI the image builds: "public", or "forge" once the bundle fetched under `root` is
    the one the deployment pins; a problem raises ConfigError with the fix."""
    if bundle is None:
        return "public"
    fetch = "run `mtrl forge-cli` (make deploy runs it before cdk deploy)"
    if bundle.sha256 is None:
        raise ConfigError(
            f"forge_cli_bundle has no sha256: {fetch}, review what it downloaded, and set "
            "forge_cli_bundle.sha256 to the digest it prints"
        )
    folder = root / FORGE_CLI_BUNDLE
    if not folder.is_dir():
        raise ConfigError(f"forge_cli_bundle: no bundle in {FORGE_CLI_BUNDLE}: {fetch}")
    found = bundle_digest(folder)
    if found != bundle.sha256:
        raise ConfigError(
            f"forge_cli_bundle: the bundle in {FORGE_CLI_BUNDLE} has digest {found}, not the "
            f"pinned {bundle.sha256}: {fetch} again"
        )
    return "forge"


class NovaLauncher(Construct):
    """Attributes: `function`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        eks_cluster: str,
        hyperpod_cluster: str,
        network: ClusterNetwork,
        log_key: kms.IKey,
        forge_cli: ForgeCliBundle | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        code = lambda_.Code.from_asset_image(
            str(PROJECT_ROOT),
            file=DOCKERFILE,
            exclude=[*only_folders(BUILD_CONTEXT), "**/__pycache__"],
            platform=ecr_assets.Platform.LINUX_AMD64,
            cmd=[HANDLER],
            build_args={
                "REQUIREMENTS": " ".join(REQUIREMENTS),
                "HYPERPOD_CLI": checked_bundle(forge_cli),
            },
        )
        self.function = pipeline_function(
            self,
            "Function",
            handler=lambda_.Handler.FROM_IMAGE,
            runtime=lambda_.Runtime.FROM_IMAGE,
            description="Starts and stops Nova jobs with AWS's HyperPod CLI and helm",
            code=code,
            # `helm install` returns once the chart's objects exist (no --wait): seconds.
            timeout=Duration.minutes(10),
            memory_size=2048,
            environment=environment_for(
                LauncherSettings, eks_cluster=eks_cluster, hyperpod_cluster=hyperpod_cluster
            ),
            network=network,
            log_key=log_key,
            invocation="The Nova plane invokes it synchronously (RequestResponse) and fails the "
            "step with its error",
        )
