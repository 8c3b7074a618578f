"""Where the pipeline's steps are put together: settings from the function's environment, its
AWS clients, and the compute planes — the deployed ones (ECS, HyperPod) unless others are given
(local mode gives its local processes). Every pipeline function has the same steps; its
handler names the one it runs. A step's body is the method of its name on one of the step
classes (RunSteps, ComputeSteps, Reaper): the step table (steps.py) says which steps exist."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

from pydantic import TypeAdapter

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
from lambdas.pipeline.steps import STEPS
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
    return step_bodies(RunSteps(dependencies), ComputeSteps(dependencies), Reaper(dependencies))


def step_bodies(*step_classes: object) -> dict[str, Handler]:
    """Each step of the step table (steps.py) by name, as its Lambda runs it: the method of that
    name of the one step class that has it, at the boundary (`at_the_boundary`). A step no class
    has, or two have, is an error here, not a missing function at deploy."""
    bodies: dict[str, Handler] = {}
    for step in STEPS:
        found = [
            getattr(c, step.name) for c in step_classes if callable(getattr(c, step.name, None))
        ]
        if len(found) != 1:
            raise LookupError(
                f"step {step.name!r} (lambdas/pipeline/steps.py): {len(found)} of the step "
                "classes have a method of its name; exactly one must"
            )
        bodies[step.name] = at_the_boundary(found[0])
    return bodies


def at_the_boundary(body: Callable[[Any], Any]) -> Handler:
    """`body` as a Lambda invocation runs it: the event parsed into the type its parameter is
    annotated with (one that does not fit is refused with pydantic's ValidationError, which
    names the field), and the result it returns, of the type its return is annotated with,
    turned into JSON data for the state machine."""
    hints = get_type_hints(body)
    (parameter,) = inspect.signature(body).parameters
    given, returned = TypeAdapter(hints[parameter]), TypeAdapter(hints["return"])

    def handler(event: dict[str, Any]) -> Any:
        return returned.dump_python(body(given.validate_python(event)), mode="json")

    return handler
