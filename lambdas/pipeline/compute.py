"""The compute steps of a run, over the backend interfaces (domain/backends.py).

Each step is thin: the state (run id, config, queues) comes in, one backend call goes out, a
small result comes back for the state machine's Choice states. Which backends serve is decided
where the steps are composed (lambdas/pipeline/composition.py; local mode binds its own).
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Sequence
from typing import Any

from domain.backends import (
    METRICS_OBJECT,
    WAITING,
    EvaluationUnsupported,
    Phase,
    RunContext,
    recent_metrics,
)
from domain.bucket import EVALUATION_OBJECT, SUMMARY_OBJECT, run_output_prefix, run_outputs
from domain.episodes import Episode, EvaluationStage
from domain.evaluation import EvaluationReport, compare, read_episodes, summarize
from domain.health import findings, held_out_caution, step_figures
from domain.run_queues import purge_run_queues
from domain.run_state import (
    Collected,
    CollectRequest,
    EvaluationJob,
    EvaluationRequest,
    JobReport,
    NodesReady,
    OpenedPhase,
    PhaseRequest,
    RegisteredRun,
    Released,
    ReleasedIdle,
    RunState,
    ScaledUp,
    SubmittedJob,
    WorkersHealthy,
    WorkersStarted,
)
from domain.runs import RunRecord, RunStore
from domain.serverless_job import run_job_names
from domain.step_metrics import first_error
from lambdas.pipeline import policies
from lambdas.pipeline.checkpoints import best_checkpoint, recorded_checkpoints
from lambdas.pipeline.dependencies import Compute, Dependencies
from lambdas.pipeline.model_registry import register_model
from lambdas.pipeline.notify import alert_health
from lambdas.router.conversations import ConversationStore


class RunPastDeadline(RuntimeError):
    """The run's deadline passed while it waited for compute."""


class EvaluationFailed(RuntimeError):
    """An evaluation job did not succeed: the run fails like at any other step."""


class ComputeSteps:
    def __init__(self, dependencies: Dependencies) -> None:
        self.settings, self.clients = dependencies.settings, dependencies.clients
        self.compute, self.clock = dependencies.compute, dependencies.clock
        self.training_metrics = dependencies.training_metrics

    def _context(self, state: RunState, *, run_token: str = "") -> RunContext:
        run = state.registered
        return RunContext(
            run_id=run.run_id,
            queues=state.resources.queues if state.resources else {},
            router_url=self.settings.router_url,
            run_token=run_token,
            bucket=state.bucket,
            dataset_key=state.key,
            dataset_version=state.version_id,
            output_prefix=run_output_prefix(run.run_id),
            rollout_request_arn=(state.resources.rollout_request_arn if state.resources else None),
            config=run.config,
            base=run.base,
        )

    def _check_deadline(self, run: RegisteredRun) -> None:
        if self.clock() > run.deadline_at:
            raise RunPastDeadline(f"run {run.run_id} passed its deadline while waiting for compute")

    def scale_up(self, state: RunState) -> ScaledUp:
        config = state.registered.config
        instances = config.instance_count or 0  # a serverless run has none
        self.compute.cluster.scale_up(self._context(state), instances=instances)
        return ScaledUp(instances=instances, scale_to_zero=config.scale_to_zero)

    def nodes_ready(self, state: RunState) -> NodesReady:
        self._check_deadline(state.registered)
        ready = self.compute.cluster.nodes_ready(self._context(state))
        return NodesReady(ready=ready >= (state.registered.config.instance_count or 0), nodes=ready)

    def start_workers(self, state: RunState) -> WorkersStarted:
        """Start the reward fleet with a fresh run token (stored hashed; never in the state)."""
        context = self._context(state, run_token=secrets.token_urlsafe(32))
        store = ConversationStore(self.clients("dynamodb"), self.settings.conversations_table)
        store.put_run(
            context.run_id,
            token=context.run_token,
            queues=context.queues,
            model=context.training.model,
            now=self.clock(),
            deadline_at=state.registered.deadline_at,
            # A serverless run's jobs: the agent Lambda sends their rollouts to this run only.
            jobs=run_job_names(self.settings.name_prefix, context.run_id)
            if context.training.plane == "serverless"
            else (),
        )
        workers = self.compute.fleet.start(context, workers=context.training.reward_workers)
        return WorkersStarted(workers=len(workers))

    def workers_healthy(self, state: RunState) -> WorkersHealthy:
        self._check_deadline(state.registered)
        healthy = self.compute.fleet.healthy(self._context(state))
        return WorkersHealthy(
            ready=healthy >= state.registered.config.reward_workers, healthy=healthy
        )

    def open_phase(self, request: PhaseRequest) -> OpenedPhase:
        """Open the run's next phase before its job starts: the router refuses what the phase
        before still sends from now (lambdas/router/), and the run's queues are emptied of what
        it sent, as AWS's Forge SDK has them emptied between training and evaluation. The first
        phase finds its queues new."""
        opened, state = OpenedPhase(phase=request.phase), request.state
        run_id = state.registered.run_id
        store = ConversationStore(self.clients("dynamodb"), self.settings.conversations_table)
        previous = store.open_phase(run_id, opened.phase, now=self.clock())
        if previous is None or state.resources is None:
            return opened
        purged = purge_run_queues(self.clients("sqs"), state.resources.queues)
        return opened.model_copy(
            update={"purged": purged, "wait_seconds": self.settings.purge_seconds}
        )

    def submit_job(self, state: RunState) -> SubmittedJob:
        return SubmittedJob(job=self.compute.cluster.submit(self._context(state)))

    def monitor(self, state: RunState) -> JobReport:
        """One poll: the job's phase, or the pipeline's reason to stop the run
        (lambdas/pipeline/policies.py)."""
        run = state.registered
        record = RunStore(self.clients("dynamodb"), self.settings.runs_table).get(run.run_id)
        verdict = record and policies.must_stop(
            record, budget_usd=run.config.budget_usd, now=self.clock()
        )
        if verdict:
            return JobReport(phase=verdict.phase, reason=verdict.reason)
        context = self._context(state)
        status = self.compute.cluster.status(context)
        quiet = policies.quiet_polls(status, state.job)
        lines = recent_metrics(
            self.clients("s3"), bucket=context.bucket,
            key=f"{context.output_prefix}{METRICS_OBJECT}",
        )  # fmt: skip
        found = findings(lines, run.config.health)
        published = self._publish(run.run_id, lines, state.job)
        verdict = (
            policies.stalled(
                status,
                quiet,
                rollout_timeout_seconds=run.config.rollout_timeout_seconds,
                poll_seconds=run.poll_seconds,
            )
            or policies.unhealthy(status, found)
            or policies.unscored(status, lines)
        )
        phase, reason = (
            (verdict.phase, verdict.reason) if verdict else (status.phase, status.reason)
        )
        warnings = {f.rule.metric: f.reason() for f in found if not f.stops}
        self._keep_warnings(record, warnings)
        return JobReport(
            phase=phase, reason=reason, step=status.step, quiet_polls=quiet,
            health=list(warnings.values()), published_step=published,
        )  # fmt: skip

    def _publish(
        self, run_id: str, lines: list[dict[str, Any]], last: JobReport | None
    ) -> int | None:
        """Each step not yet on the dashboard (a step rewritten by a resume counts once); the
        last step published."""
        done = last.published_step if last else None
        by_step = {line["step"]: line for line in lines if isinstance(line.get("step"), int)}
        ordered = sorted(by_step)
        for index, step in enumerate(ordered):
            if done is None or step > done:
                figures = step_figures([by_step[s] for s in ordered[: index + 1]])
                self.training_metrics.publish(run_id, step, figures)
                done = step
        return done

    def _keep_warnings(self, record: RunRecord | None, current: dict[str, str]) -> None:
        """The run's health warnings (reasons by metric) on its record (`mtrl status`, the end
        notification), and an alert when a rule starts to hold."""
        if record is None or current == record.health:
            return
        runs = RunStore(self.clients("dynamodb"), self.settings.runs_table)
        runs.update(record.run_id, now=self.clock(), health=current)
        started = [current[metric] for metric in sorted(set(current) - set(record.health))]
        if started and self.settings.alert_topic_arn:
            alert_health(self.clients("sns"), self.settings.alert_topic_arn, record.run_id, started)

    def start_evaluation(self, request: EvaluationRequest) -> EvaluationJob:
        """Submit the evaluation of the stage's model on the run's held-out records, or say why
        there is none (the config holds nothing out, or the plane cannot evaluate): then it is
        ready at once and the run goes on."""
        stage, state = request.stage, request.state
        config = state.registered.config
        if not config.evaluates:
            skipped = "the config holds no records out (eval_fraction 0, no eval_dataset)"
            return EvaluationJob(stage=stage, skipped=skipped, ready=True)
        try:
            job = self.compute.cluster.submit_evaluation(self._context(state), stage=stage)
        except EvaluationUnsupported as error:
            return EvaluationJob(stage=stage, skipped=str(error), ready=True)
        return EvaluationJob(stage=stage, job=job)

    def evaluation_status(self, request: EvaluationRequest) -> EvaluationJob:
        """One poll of the stage's evaluation; once it succeeded, its headline figures. A failed
        evaluation fails the run."""
        stage, state = request.stage, request.state
        self._check_deadline(state.registered)
        submitted = state.evaluations[stage]
        context = self._context(state)
        status = self.compute.cluster.evaluation_status(context, stage=stage)
        phase = Phase(status.phase)
        if phase not in (Phase.SUCCEEDED, *WAITING):
            raise EvaluationFailed(f"the {stage} evaluation ended {phase}: {status.reason}")
        update: dict[str, Any] = {"phase": phase, "ready": phase is Phase.SUCCEEDED}
        if phase is Phase.SUCCEEDED:
            config = state.registered.config
            found = read_episodes(
                self.clients("s3"), bucket=context.bucket, output_prefix=context.output_prefix,
                stage=stage,
            )  # fmt: skip
            summary = summarize(stage, found, k=config.eval_samples)
            if stage is EvaluationStage.BASELINE and summary.n and not summary.scored:
                raise EvaluationFailed(_unscored_baseline(found))
            update |= {"n": summary.n, "mean_reward": summary.mean_reward}
            update |= {"pass_at_1": summary.pass_at_1}
        return submitted.model_copy(update=update)

    def collect(self, request: CollectRequest) -> Collected:
        """Write `runs/<run_id>/evaluation.json` (both evaluations and the change), register the
        best checkpoint in the deployment's model registry, and write `summary.json` (config,
        job, evaluation, outputs found, checkpoints, the model package; a managed job's tokens
        billed) next to the outputs."""
        state = request.state
        s3, run = self.clients("s3"), state.registered
        prefix = run_output_prefix(run.run_id)
        evaluation = evaluation_report(s3, self._context(state), state)
        s3.put_object(
            Bucket=state.bucket,
            Key=f"{prefix}{EVALUATION_OBJECT}",
            Body=evaluation.model_dump_json(indent=2).encode(),
            ContentType="application/json",
        )
        outputs = run_outputs(s3, bucket=state.bucket, prefix=prefix)
        found = recorded_checkpoints(s3, bucket=state.bucket, prefix=prefix, outputs=outputs)
        best = best_checkpoint(found, evaluation)
        group = self.settings.model_package_group
        # A managed job registers its model itself; others' best checkpoint is registered here.
        managed = self.compute.cluster.managed_job_output(self._context(state))
        package = managed.output_model_package_arn if managed else None
        if package is None and group and best and best["uri"]:
            package = register_model(
                self.clients("sagemaker"),
                group=group,
                run_id=run.run_id,
                config_name=run.config.name,
                checkpoint=best["uri"],
                evaluation=evaluation,
                evaluation_uri=f"s3://{state.bucket}/{prefix}{EVALUATION_OBJECT}",
                generated_by=request.execution_arn,
            )
        summary = {
            "run_id": run.run_id,
            "dataset": f"s3://{state.bucket}/{state.key}",
            "config": run.config.model_dump(mode="json"),
            "job": state.job.model_dump(mode="json") if state.job else None,
            "evaluation": evaluation.model_dump(mode="json"),
            "outputs": outputs,
            "checkpoints": [c.model_dump() for c in found],
            "best_checkpoint": best,
            "model_package": package,
        }
        if managed is not None:  # what AWS billed the managed job, as it reported it
            summary["billable_token_usage"] = managed.billable_token_usage
        s3.put_object(
            Bucket=state.bucket,
            Key=f"{prefix}{SUMMARY_OBJECT}",
            Body=json.dumps(summary, indent=2).encode(),
            ContentType="application/json",
        )
        pass_change = evaluation.delta.get("pass_at_1")
        caution = held_out_caution(
            recent_metrics(s3, bucket=state.bucket, key=f"{prefix}{METRICS_OBJECT}"),
            pass_change.delta if pass_change else None,
        )
        return Collected(
            results=f"s3://{state.bucket}/{prefix}",
            objects=len(outputs),
            evaluation=evaluation.headline(),
            caution=caution,  # the held-out check on a reward that rose (domain/health.py)
        )

    def release_compute(self, state: RunState) -> Released:
        """Teardown of the compute planes (idempotent): workers, job, nodes."""
        if state.run is None:
            return Released(workers_stopped=0, job_objects_deleted=0)  # failed before Register
        scale_down = state.run.config.scale_to_zero
        return release(self._context(state), self.compute, scale_down=scale_down)

    def release_idle(self, event: dict[str, Any]) -> ReleasedIdle:
        """Scheduled (its event says nothing the step needs): scale nodes kept warm to zero
        once no run took them for the keep-warm period."""
        return ReleasedIdle(released=self.compute.cluster.release_idle())


def _unscored_baseline(episodes: Sequence[Episode]) -> str:
    """Why a run stops before training: its starting model's evaluation scored nothing."""
    ended = Counter(episode.stop_reason for episode in episodes)
    how = ", ".join(f"{count} {reason}" for reason, count in sorted(ended.items()))
    error = first_error(episode.error for episode in episodes)
    return (
        f"the baseline evaluation scored none of its {len(episodes)} rollouts ({how}): training "
        "on this environment as it runs would learn nothing; `mtrl env check` it, or see the "
        "reward workers' logs" + (f"; the first failure: {error}" if error else "")
    )


def evaluation_report(s3: Any, run: RunContext, state: RunState) -> EvaluationReport:
    """Both evaluations of the run from their episodes, the change between them, and why an
    evaluation was skipped."""
    episodes = {
        stage: read_episodes(s3, bucket=run.bucket, output_prefix=run.output_prefix, stage=stage)
        for stage in EvaluationStage
    }
    summaries = {
        stage: summarize(stage, found, k=run.training.eval_samples)
        for stage, found in episodes.items()
        if state.evaluations.get(stage) and state.evaluations[stage].job
    }
    return EvaluationReport(
        baseline=summaries.get(EvaluationStage.BASELINE),
        final=summaries.get(EvaluationStage.FINAL),
        delta=compare(
            episodes[EvaluationStage.BASELINE],
            episodes[EvaluationStage.FINAL],
            seed=run.training.eval_seed,
        ),
        skipped={stage: job.skipped for stage, job in state.evaluations.items() if job.skipped},
    )


def release(run: RunContext, compute: Compute, *, scale_down: bool) -> Released:
    """Stop the run's workers, delete its job, let go of its nodes (each step idempotent)."""
    stopped = compute.fleet.stop(run)
    deleted = compute.cluster.delete(run)
    if scale_down:
        compute.cluster.scale_down(run)
    return Released(workers_stopped=stopped, job_objects_deleted=deleted)


def teardown_context(run_id: str) -> RunContext:
    """What the backends need to find and remove a run's compute: its id, from which every
    name derives (stopping, deleting and scaling down read nothing of its data). For the
    reaper, which has the run's record but not its state."""
    return RunContext(
        run_id=run_id,
        queues={},
        router_url=None,
        run_token="",
        bucket="",
        dataset_key="",
        dataset_version=None,
        output_prefix=run_output_prefix(run_id),
    )
