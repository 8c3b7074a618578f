"""What the pipeline's steps are made of: settings, AWS clients, the compute planes, a clock."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from domain.backends import RewardFleet, TrainingCluster
from lambdas.clients import Clients
from lambdas.pipeline.settings import PipelineSettings
from lambdas.pipeline.training_metrics import TrainingMetrics


class Compute:
    """The two planes, each made when a step first needs it (a function that only validates
    never has the settings to make either)."""

    def __init__(
        self, *, fleet: Callable[[], RewardFleet], cluster: Callable[[], TrainingCluster]
    ) -> None:
        self._fleet = functools.cache(fleet)
        self._cluster = functools.cache(cluster)

    @property
    def fleet(self) -> RewardFleet:
        return self._fleet()

    @property
    def cluster(self) -> TrainingCluster:
        return self._cluster()


@dataclass(frozen=True)
class Dependencies:
    settings: PipelineSettings
    clients: Clients
    compute: Compute
    training_metrics: TrainingMetrics  # where Monitor publishes each step's figures
    clock: Callable[[], float] = field(default=time.time)
