"""The deployment's training planes behind the one TrainingCluster interface: a serverless config
takes SageMaker's managed job (lambdas/pipeline/serverless_training.py); otherwise a run's model
picks its plane — a Nova model the restricted instance group and AWS's launcher
(lambdas/pipeline/nova_training.py), any other the standard group and our job
(lambdas/pipeline/hyperpod_training.py). A teardown that knows only the run's id (the reaper)
asks every plane: each removes what it has of the run and nothing else."""

from __future__ import annotations

from domain.backends import JobStatus, RunContext, TrainingCluster
from domain.episodes import EvaluationStage
from domain.nova_job import NO_NOVA_GROUP, NovaRefused, is_nova
from domain.serverless_job import NO_SERVERLESS_PLANE, ServerlessRefused, ServiceOutput


class TrainingPlanes(TrainingCluster):
    def __init__(
        self,
        *,
        standard: TrainingCluster,
        nova: TrainingCluster | None,
        serverless: TrainingCluster | None = None,
    ) -> None:
        self.standard, self.nova, self.serverless = standard, nova, serverless

    @property
    def planes(self) -> list[TrainingCluster]:
        others = (self.nova, self.serverless)
        return [self.standard, *(plane for plane in others if plane is not None)]

    def plane(self, run: RunContext) -> TrainingCluster:
        if run.training.plane == "serverless":
            if self.serverless is None:
                raise ServerlessRefused(
                    f"run {run.run_id}: config {run.training.name} {NO_SERVERLESS_PLANE}"
                )
            return self.serverless
        if not is_nova(run.training.model):
            return self.standard
        if self.nova is None:  # Register refuses such a run first
            raise NovaRefused(f"run {run.run_id}: model {run.training.model} {NO_NOVA_GROUP}")
        return self.nova

    def scale_up(self, run: RunContext, *, instances: int) -> None:
        self.plane(run).scale_up(run, instances=instances)

    def nodes_ready(self, run: RunContext) -> int:
        return self.plane(run).nodes_ready(run)

    def submit(self, run: RunContext) -> str:
        return self.plane(run).submit(run)

    def status(self, run: RunContext) -> JobStatus:
        return self.plane(run).status(run)

    def submit_evaluation(self, run: RunContext, *, stage: EvaluationStage) -> str:
        return self.plane(run).submit_evaluation(run, stage=stage)

    def evaluation_status(self, run: RunContext, *, stage: EvaluationStage) -> JobStatus:
        return self.plane(run).evaluation_status(run, stage=stage)

    def managed_job_output(self, run: RunContext) -> ServiceOutput | None:
        return self.plane(run).managed_job_output(run)

    def delete(self, run: RunContext) -> int:
        if run.config is not None:
            return self.plane(run).delete(run)
        return sum(plane.delete(run) for plane in self.planes)

    def scale_down(self, run: RunContext) -> None:
        for plane in [self.plane(run)] if run.config is not None else self.planes:
            plane.scale_down(run)

    def release_idle(self, *, immediately: bool = False) -> bool:
        released = [plane.release_idle(immediately=immediately) for plane in self.planes]
        return any(released)
