"""Where the pipeline's steps are put together: settings from the function's environment, its
AWS clients, and the compute planes — the deployed ones (ECS, HyperPod) unless others are given
(local mode gives its local processes). Every pipeline function has the same steps; its
handler names the one it runs."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from lambdas.clients import Clients, Handler
from lambdas.pipeline.compute import ComputeSteps
from lambdas.pipeline.dependencies import Compute, Dependencies
from lambdas.pipeline.ecs_fleet import EcsRewardFleet
from lambdas.pipeline.hyperpod_training import HyperPodTrainingCluster
from lambdas.pipeline.nova_training import NOVA_GROUP_SETTING, NovaTrainingCluster
from lambdas.pipeline.reaper import Reaper
from lambdas.pipeline.run_steps import RunSteps
from lambdas.pipeline.serverless_training import SERVERLESS_ROLE_SETTING, ServerlessTrainingCluster
from lambdas.pipeline.settings import PipelineSettings
from lambdas.pipeline.training_metrics import EmbeddedMetrics, TrainingMetrics
from lambdas.pipeline.training_planes import TrainingPlanes


def deployed_compute(environment: Mapping[str, str], clients: Clients) -> Compute:
    """ECS Fargate reward workers and the training planes, as the stack set them up: the Nova
    plane where the deployment has a restricted instance group, the serverless plane where it
    has the managed job's role (the stack then sets their settings)."""

    def planes() -> TrainingPlanes:
        nova = (
            NovaTrainingCluster.from_environment(environment, clients)
            if NOVA_GROUP_SETTING in environment
            else None
        )
        serverless = (
            ServerlessTrainingCluster.from_environment(environment, clients)
            if SERVERLESS_ROLE_SETTING in environment
            else None
        )
        standard = HyperPodTrainingCluster.from_environment(environment, clients)
        return TrainingPlanes(standard=standard, nova=nova, serverless=serverless)

    return Compute(
        fleet=lambda: EcsRewardFleet.from_environment(environment, clients), cluster=planes
    )


def compose(
    environment: Mapping[str, str],
    clients: Clients,
    *,
    compute: Compute | None = None,
    training_metrics: TrainingMetrics | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Handler]:
    """The pipeline's steps by handler name (deployed: ECS, HyperPod, metrics in the log)."""
    settings = PipelineSettings.from_environment(environment)
    dependencies = Dependencies(
        settings=settings,
        clients=clients,
        compute=compute or deployed_compute(environment, clients),
        training_metrics=training_metrics or EmbeddedMetrics(settings.name_prefix),
        clock=clock,
    )
    runs, work, reaper = RunSteps(dependencies), ComputeSteps(dependencies), Reaper(dependencies)
    return {
        "start_run": runs.start_run,
        "validate": runs.validate,
        "register": runs.register,
        "provision": runs.provision,
        "scale_up": work.scale_up,
        "nodes_ready": work.nodes_ready,
        "start_workers": work.start_workers,
        "workers_healthy": work.workers_healthy,
        "open_phase": work.open_phase,
        "submit_job": work.submit_job,
        "start_evaluation": work.start_evaluation,
        "evaluation_status": work.evaluation_status,
        "monitor": work.monitor,
        "collect": work.collect,
        "release_compute": work.release_compute,
        "teardown": runs.teardown,
        "notify_end": runs.notify_end,
        "reap": reaper.reap,
        "release_idle": work.release_idle,
    }
