"""The launcher function: AWS's HyperPod CLI and recipes, and helm, in a container image built
at deploy time (stacks/assets/launcher/Dockerfile). The Nova training plane
(lambdas/pipeline/nova_training.py) invokes it to start a run's job and to stop it; each call
gets a kubeconfig with a fresh EKS token (helm reads nothing else), and a start the cluster
context `hyperpod connect-cluster` would have stored — the HyperPod cluster as SageMaker
describes it, which `hyperpod start-job` reads once its job is installed (HyperPod CLI
release_v2, commands/job.py `start_job` → utils.py `get_cluster_console_url`: without it the
CLI fails after the install)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from domain.nova_job import (
    FORGE_RECIPES,
    NAMESPACE,
    RUN_NAME_LIMIT,
    evaluation_image,
    evaluation_run_recipe,
    images,
    run_recipe,
)
from lambdas.clients import Clients, Handler, lambda_entries
from lambdas.environment import EnvironmentSettings
from lambdas.kubernetes.token import EksTokenSource, regional_sts
from lambdas.launcher.hyperpod_cli import HyperPodCli, Runner, run_process


class LauncherSettings(EnvironmentSettings):
    eks_cluster: str = Field(alias="EKS_CLUSTER")
    hyperpod_cluster: str = Field(alias="HYPERPOD_CLUSTER")
    # Where the CLI keeps its cluster context (constants/command_constants.py
    # GENERATED_LAUNCHER_CONFIG_FILE_PATH + HYPERPOD_CLUSTER_CONTEXT_FILE_NAME).
    context_file: Path = Field(
        default=Path("/tmp/hyperpod_current_context.json"), alias="HYPERPOD_CONTEXT_FILE"
    )
    region: str = Field(alias="AWS_REGION")
    # In the image (stacks/assets/launcher/Dockerfile): the CLI's recipes collection, and the
    # NeMo launcher scripts AWS's launcher imports.
    recipes: Path = Field(alias="HYPERPOD_RECIPES")
    nemo_launcher: Path = Field(alias="NEMO_LAUNCHER_SCRIPTS")
    workdir: Path = Field(default=Path("/tmp/nova-mtrl-launcher"), alias="LAUNCHER_WORKDIR")


# A run's name as `domain.nova_job.run_name` makes it: a DNS label the launcher keeps whole.
RunName = Annotated[str, Field(pattern=rf"^[a-z][a-z0-9-]{{0,{RUN_NAME_LIMIT - 1}}}$")]


class LaunchRefused(ValueError):
    """A start the launcher does not run: what is wrong and what it takes."""


class StartJob(BaseModel):
    """Start run `name`'s job from recipe `body`, written as `recipe` in the recipes collection."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["start"]
    name: RunName
    recipe: str
    body: dict[str, Any]
    instance_type: Annotated[str, Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$")]
    container: str

    def check(self, region: str) -> None:
        """Only a run's own recipe, beside AWS's Forge recipes, and only a Nova image of
        `region` (the function is in the launcher group, which may create workloads in Nova's
        namespace: what it starts is never an invoker's choice of file or image)."""
        recipes = {*(run_recipe(r, self.name) for r in FORGE_RECIPES),
                   evaluation_run_recipe(self.name)}  # fmt: skip
        if self.recipe not in recipes:
            raise LaunchRefused(
                f"recipe {self.recipe!r} is not run {self.name}'s: one of {sorted(recipes)}"
            )
        containers = {*images(region).values(), evaluation_image(region)} - {None}
        if self.container not in containers:
            raise LaunchRefused(
                f"container {self.container!r} is not a Nova image of {region}: one of "
                f"{sorted(containers)}"
            )


class StopJob(BaseModel):
    """Uninstall every release of run `name`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["stop"]
    name: RunName


LauncherRequest = Annotated[StartJob | StopJob, Field(discriminator="action")]
REQUEST = TypeAdapter(LauncherRequest)


def launch(request: StartJob | StopJob, cli: HyperPodCli) -> dict[str, Any]:
    if isinstance(request, StopJob):
        return {"releases": cli.stop(request.name)}
    job = cli.start(
        name=request.name, recipe=request.recipe, body=request.body,
        instance_type=request.instance_type, container=request.container,
    )  # fmt: skip
    return {"job": job}


def kubeconfig(*, endpoint: str, certificate_authority: str, token: str) -> dict[str, Any]:
    """One cluster, one user with a bearer token, the Nova jobs' namespace."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "eks",
                "cluster": {
                    "server": endpoint,
                    "certificate-authority-data": certificate_authority,
                },
            }
        ],
        "users": [{"name": "launcher", "user": {"token": token}}],
        "contexts": [
            {
                "name": "eks",
                "context": {"cluster": "eks", "user": "launcher", "namespace": NAMESPACE},
            }
        ],
        "current-context": "eks",
    }


def store_cluster_context(sagemaker: Any, settings: LauncherSettings) -> None:
    """What `hyperpod connect-cluster` stores: the cluster's DescribeCluster answer."""
    described = sagemaker.describe_cluster(ClusterName=settings.hyperpod_cluster)
    described.pop("ResponseMetadata", None)
    settings.context_file.write_text(json.dumps(described, indent=4, default=str), encoding="utf-8")


def compose(
    environment: Mapping[str, str], clients: Clients, *, run: Runner = run_process
) -> dict[str, Handler]:
    settings = LauncherSettings.from_environment(environment)

    def launcher(event: dict[str, Any]) -> dict[str, Any]:
        request = REQUEST.validate_python(event)
        if isinstance(request, StartJob):
            request.check(settings.region)
            store_cluster_context(clients("sagemaker"), settings)
        cluster = clients("eks").describe_cluster(name=settings.eks_cluster)["cluster"]
        token = EksTokenSource(settings.eks_cluster, sts=regional_sts(clients, settings.region))
        settings.workdir.mkdir(parents=True, exist_ok=True)
        config = settings.workdir / "kubeconfig"
        config.touch(mode=0o600)
        config.write_text(
            yaml.safe_dump(
                kubeconfig(
                    endpoint=cluster["endpoint"],
                    certificate_authority=cluster["certificateAuthority"]["data"],
                    token=token(),
                )
            ),
            encoding="utf-8",
        )
        cli = HyperPodCli(
            recipes=settings.recipes,
            workdir=settings.workdir,
            # The function's own credentials and region, a writable home, this kubeconfig.
            environment={
                **environment,
                "HOME": str(settings.workdir),
                "KUBECONFIG": str(config),
                "PYTHONPATH": str(settings.nemo_launcher),
            },  # fmt: skip
            run=run,
        )
        return launch(request, cli)

    return {"launch_job": launcher}


launch_job = lambda_entries(compose, os.environ)("launch_job")
