"""The open-weights trainer's jobs: training (GRPO over the rollout protocol) and the evaluation
of the starting or trained model.

Training, per step: draw records and send `group_size` rollout requests each (domain/trainer_job.py,
as the local trainer does), answer the generate requests with the current weights meanwhile
(service.py), collect the rollout responses under the run's timeout, score the groups
(domain/grpo.py), build token-exact sequences from what generation kept (tokens.py), update
(grpo.py), hand the new weights to generation and write the step's metrics line. Every
`checkpoint_every` steps and at the end it saves a checkpoint (checkpoints.py).

A restarted job (HyperPod's auto-resume) finds the run's own checkpoints and goes on from the
latest: its weights, optimizer state, step count and metrics lines up to it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from domain.checkpoints import step_checkpoint_name
from domain.dataset import DatasetRecord
from domain.episodes import Episode, EvaluationStage
from domain.grpo import (
    ScoredRollout,
    StepMetrics,
    UpdateStats,
    flat_group_samples,
    learning_groups,
    score_groups,
    truncated,
)
from domain.protocol import RolloutResponse
from domain.run_queues import QueueKind
from domain.trainer_job import (
    PlayedStep,
    RolloutInbox,
    TrainingFailed,
    TrainingJob,
    await_step,
    earlier_metrics,
    metrics_lines_of,
    play_evaluation,
    publish_step,
    refill_requests,
    send_groups,
    send_step,
    training_records_of,
)
from llm_trainer.checkpoints import FINAL, CheckpointStore, download_model, scratch_folder
from llm_trainer.distributed import ALONE, Collective
from llm_trainer.generation import Generator, TransformersGenerator
from llm_trainer.grpo import (
    Reference,
    TrainingSequence,
    grpo_update,
    loss_settings,
    mismatch_of,
    scheduled_learning_rate,
    training_sequences,
)
from llm_trainer.model import ModelNotLoaded, Policy, load_policy, reads_weights
from llm_trainer.service import GenerationService
from llm_trainer.tokens import merged_turns, segments, stale_samples

log = logging.getLogger("mtrl.trainer")


def generation_kind(choice: str, *, lora: bool, gpu: bool, vllm_installed: bool) -> str:
    """`grpo.generation` resolved: `auto` is vLLM where it can serve the run (a LoRA adapter, a
    GPU, vLLM installed), transformers elsewhere."""
    if choice != "auto":
        return choice
    return "vllm" if lora and gpu and vllm_installed else "transformers"


def _generator(policy: Policy, job: TrainingJob, *, adapters: Path, processes: int) -> Generator:
    """What samples the policy's turns, as the config's `grpo.generation` says (vLLM: the
    adapter handed over through folders in `adapters`)."""
    kind = generation_kind(
        job.config.grpo.generation, lora=policy.lora, gpu=policy.device.type == "cuda",
        vllm_installed=importlib.util.find_spec("vllm") is not None,
    )  # fmt: skip
    log.info("generating with %s (grpo.generation: %s)", kind, job.config.grpo.generation)
    if kind == "vllm":
        try:
            from llm_trainer.vllm_generator import VllmGenerator, start_engine, vllm_api

            engine = start_engine(policy.base, job.config, seed=job.seed, processes=processes)
            generator = VllmGenerator(engine, vllm_api(), adapters=adapters)
        except ImportError as missing:
            raise ModelNotLoaded(
                f"grpo.generation vllm needs {missing.name} (the trainer image has it); "
                "set generation: transformers to sample with the model being trained"
            ) from None
        generator.sync(policy.model)
        return generator
    stop = policy.model.generation_config.eos_token_id
    stop_ids = {policy.tokenizer.eos_token_id, *(stop if isinstance(stop, list) else [stop])}
    return TransformersGenerator(
        policy.model,
        stop_token_ids=[token for token in stop_ids if token is not None],
        pad_token_id=policy.tokenizer.pad_token_id,
        autocast=policy.autocast,
    )


class LlmTrainer:
    def __init__(
        self,
        job: TrainingJob,
        *,
        sqs: Any,
        s3: Any,
        workdir: Path,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        collective: Collective = ALONE,
        adapters: Path | None = None,
    ) -> None:
        """`collective`: the trainer processes of the node (llm_trainer/distributed.py); the
        first plays the steps and writes the run's outputs, every one generates and trains.
        `adapters`: where a vLLM generator is handed the adapter (default: under `workdir`)."""
        self.collective = collective
        self.job, self.config, self.sqs, self.s3 = job, job.config, sqs, s3
        self.out, self.clock, self.wall_clock = out, clock, wall_clock
        source = job.model_source or self.config.model
        self.store = CheckpointStore(
            s3, bucket=job.bucket, output_prefix=job.output_prefix, model=self.config.model,
            base_model=source,
        )  # fmt: skip
        resumed = self.store.latest()
        kl = bool(self.config.kl_coefficient)
        weights = reads_weights(self.config, collective)
        if resumed is not None:
            folder, state = self.store.restore(resumed, workdir / "resume", weights=weights)
            # The KL term still pulls towards the weights the run started from.
            starting = None
            if kl and job.base is not None and self.config.lora is None:
                starting = download_model(s3, job.base.uri, workdir / "base", weights=weights)
            self.policy = load_policy(
                source, self.config, s3=s3, workdir=workdir, checkpoint=folder,
                collective=collective, reference=kl, reference_checkpoint=starting,
            )  # fmt: skip
            self.optimizer = self.policy.optimizer(self.config.learning_rate)
            self.steps_before = self.policy.restore_optimizer(state, self.optimizer)
            lines = metrics_lines_of(s3, bucket=job.bucket, output_prefix=job.output_prefix)
            self.earlier_metrics = [line for line in lines if line["step"] <= self.steps_before]
            log.info(
                "resuming run %s from its checkpoint at step %d", job.run_id, self.steps_before
            )
        else:
            checkpoint = None
            if job.base is not None:
                checkpoint = download_model(s3, job.base.uri, workdir / "base", weights=weights)
            self.policy = load_policy(
                source, self.config, s3=s3, workdir=workdir, checkpoint=checkpoint,
                collective=collective, reference=kl, reference_checkpoint=checkpoint,
            )  # fmt: skip
            self.optimizer = self.policy.optimizer(self.config.learning_rate)
            self.steps_before = job.base_step
            self.earlier_metrics = earlier_metrics(s3, job)
        self.reference = (
            Reference(self.policy.model, lora=self.policy.lora, frozen=self.policy.frozen)
            if self.config.kl_coefficient
            else None
        )
        self.generator = _generator(
            self.policy, job, adapters=adapters or workdir / "adapters",
            processes=collective.world_size,
        )  # fmt: skip
        self.service = GenerationService(
            job, sqs=sqs, tokenizer=self.policy.tokenizer, generator=self.generator,
            version=self.steps_before,
        )  # fmt: skip
        self.history: list[StepMetrics] = []
        if collective.world_size > 1:
            log.info("process %d of %d: generating and training%s", collective.rank + 1,
                     collective.world_size, ", weights sharded" if self.policy.sharded else "",
            )  # fmt: skip

    @property
    def last_step(self) -> int:
        return self.steps_before + len(self.history)

    def run(self) -> list[StepMetrics]:
        """Play and train each step. With `grpo.max_off_policy_steps` = N, the rollouts of the
        next N steps are out (sent, generated by the weights of the moment, scored by the
        workers) while a step trains."""
        if self.collective.rank:
            return self._follow()
        records = training_records_of(self.s3, self.job)
        first, last = self.steps_before + 1, self.last_planned
        ahead = self.config.grpo.max_off_policy_steps
        inbox = RolloutInbox(self.sqs, self.job.queues[QueueKind.ROLLOUT_RESPONSES])
        in_flight: deque[PlayedStep] = deque()
        self.service.start()
        try:
            for step in range(first, last + 1):
                if self.service.stopped:
                    break
                while len(in_flight) <= ahead and step + len(in_flight) <= last:
                    sent = step + len(in_flight)
                    # Seeded by the step: a resumed run draws what it would have drawn.
                    rng = np.random.default_rng([self.job.seed, sent])
                    in_flight.append(
                        send_step(
                            self.sqs,
                            self.job,
                            records,
                            sent,
                            rng,
                            inbox=inbox,
                            record=self._record,
                            clock=self.clock,
                            wall_clock=self.wall_clock,
                        )
                    )
                played = await_step(
                    self.job, inbox, in_flight.popleft(), clock=self.clock,
                    stopped=lambda: self.service.stopped,
                )  # fmt: skip
                played, refilled = self._refilled(step, played, records, inbox)
                self._update(step, played, refilled=refilled)
        finally:
            self.service.stop()
        self._checkpoint(FINAL)
        self.collective.broadcast(None)  # the other processes' last order: the end
        log.info("trained %d steps; final checkpoint saved", len(self.history))
        return self.history

    def _record(self, samples: Iterable[str]) -> None:
        """Every process keeps what it samples for these samples, before any is asked for."""
        samples = set(samples)
        self.collective.broadcast(("record", samples))
        self.service.record(samples)
        self.collective.gather(None)

    def _follow(self) -> list[StepMetrics]:
        """Another process than the first: generate until told the end; for each step, hand
        over what it sampled and train on its share of the sequences; help gather sharded
        weights for a checkpoint."""
        self.service.start()
        try:
            while (order := self.collective.broadcast(None)) is not None:
                match order:
                    case ("record", samples):
                        self.service.record(samples)
                        self.collective.gather(None)  # recorded before the requests go out
                    case ("update", step, samples):
                        self.collective.gather(self.service.recorded(samples))
                        self._train(step, self.collective.broadcast(None))
                    case ("checkpoint", name):
                        self._checkpoint(name)
        finally:
            self.service.stop()
        log.info("process %d of %d: answered %d generate requests", self.collective.rank + 1,
                 self.collective.world_size, self.service.counters.answered)  # fmt: skip
        return []

    @property
    def last_planned(self) -> int:
        """The step the run ends at: a resumed run keeps the count it started with."""
        return self.job.base_step + self.config.max_steps

    def stop(self) -> None:
        self.service.stop()

    def _refilled(
        self, step: int, played: PlayedStep, records: list[DatasetRecord], inbox: RolloutInbox
    ) -> tuple[PlayedStep, int]:
        """Dynamic sampling (DAPO; `grpo.refill_rounds`): while the step has fewer groups to
        learn from than it asked for, as many new groups are played by the same weights, up to
        the bound; the step with them, and how many groups were added."""
        wanted = self.config.global_batch_size // self.config.group_size
        added = 0
        for round_ in range(1, self.config.grpo.refill_rounds + 1):
            missing = wanted - learning_groups(
                played.groups, played.responses,
                penalise_truncated=self.config.grpo.truncated_rollouts == "penalise",
            )  # fmt: skip
            if missing <= 0 or self.service.stopped:
                break
            rng = np.random.default_rng([self.job.seed, step, round_])
            groups, requests = refill_requests(self.job, records, step, round_, missing, rng)
            sent = PlayedStep(groups, {}, self.clock(), self.wall_clock())
            send_groups(self.sqs, self.job, requests, inbox=inbox, record=self._record)
            more = await_step(
                self.job, inbox, sent, clock=self.clock, stopped=lambda: self.service.stopped
            )
            played = replace(
                played, groups={**played.groups, **groups},
                responses={**played.responses, **more.responses},
            )  # fmt: skip
            added += missing
        return played, added

    def _update(self, step: int, played: PlayedStep, *, refilled: int = 0) -> None:
        grpo = self.config.grpo
        self.collective.broadcast(("update", step, played.samples))
        turns = merged_turns(self.collective.gather(self.service.recorded(played.samples)))
        stale = stale_samples(turns, version=self.service.version, bound=grpo.max_off_policy_steps)
        responses = {s: r for s, r in played.responses.items() if s not in stale}
        scored, stats = score_groups(
            played.groups, responses, normalization=grpo.advantages,
            penalise_truncated=grpo.truncated_rollouts == "penalise",
        )  # fmt: skip
        flat, cut = self._left_out(played, scored, responses)
        episodes = [
            (r.advantage, segments(turns.get(r.sample_id, [])))
            for r in scored
            if r.sample_id not in flat | cut
        ]
        sequences = training_sequences(
            episodes, aggregation=grpo.loss_aggregation,
            episode_tokens=self.config.max_turns * self.config.max_new_tokens,
        )  # fmt: skip
        if not sequences:
            log.warning(
                "step %d: no rollout to learn from (%d scored, %d of groups that all scored the "
                "same, %d truncated); no update", step, len(scored), len(flat), len(cut),
            )  # fmt: skip
        update, sync_seconds = self._train(step, self.collective.broadcast(sequences))
        metrics = StepMetrics(
            step=step,
            stats=stats,
            update=update,
            seconds=self.clock() - played.started,
            started_at=played.started_at,
            finished_at=self.wall_clock(),
            extra={
                "sampled_tokens": sum(s.segment.sampled_count for s in sequences),
                "sequences": len(sequences),
                "weight_sync_seconds": sync_seconds,
                "stale_rollouts": len(stale & played.responses.keys()),
                "refilled_groups": refilled,
                "flat_group_rollouts_skipped": len(flat),
                "truncated_rollouts_masked": len(cut),
                "learning_rate": self.optimizer.param_groups[0]["lr"],  # set by _train
            },
        )
        self.history.append(metrics)
        publish_step(
            self.s3, self.job, earlier=self.earlier_metrics, history=self.history,
            last=self.last_planned, out=self.out,
        )  # fmt: skip
        if step % grpo.checkpoint_every == 0:
            self._checkpoint(step_checkpoint_name(step))
        log.info(
            "step %d/%d: mean reward %s, %d rollouts (%d failed), %d sampled tokens, %.1f s",
            step, self.last_planned,
            "none" if stats.mean_reward is None else f"{stats.mean_reward:.3f}",
            stats.rollouts, stats.failed_rollouts, metrics.extra["sampled_tokens"], metrics.seconds,
        )  # fmt: skip

    def _left_out(
        self,
        played: PlayedStep,
        scored: list[ScoredRollout],
        responses: dict[str, RolloutResponse],
    ) -> tuple[set[str], set[str]]:
        """The scored rollouts the update leaves out: those of groups that all scored the same
        (`grpo.skip_zero_variance_groups`), and the truncated (`grpo.truncated_rollouts`)."""
        grpo = self.config.grpo
        flat = (
            flat_group_samples(played.groups, scored) if grpo.skip_zero_variance_groups else set()
        )
        cut = set()
        if grpo.truncated_rollouts == "mask":
            cut = {r.sample_id for r in scored if truncated(responses[r.sample_id])}
        return flat, cut

    def _train(
        self, step: int, sequences: list[TrainingSequence]
    ) -> tuple[UpdateStats | None, float]:
        """Every process: the update on the step's sequences (each on its share), then the
        weights handed to generation; the update's statistics and the hand-over's seconds."""
        grpo, update = self.config.grpo, None
        settings = loss_settings(self.config)
        for group in self.optimizer.param_groups:
            group["lr"] = scheduled_learning_rate(self.config, self._run_step(step))
        with self.generator.lock:
            for epoch in range(grpo.epochs if sequences else 0):
                stats = grpo_update(
                    self.policy.model, self.optimizer, sequences,
                    pad_id=self.policy.tokenizer.pad_token_id, settings=settings,
                    micro_batch_size=grpo.micro_batch_size, max_grad_norm=grpo.max_grad_norm,
                    reference=self.reference, autocast=self.policy.autocast,
                    collective=self.collective,
                )  # fmt: skip
                # The sampler/trainer gap is the first epoch's: later ones measure the update.
                update = stats if epoch == 0 else replace(stats, **mismatch_of(update))
            synced = self.clock()
            self.policy.ready_to_generate()
            self.generator.sync(self.policy.model)
            sync_seconds = self.clock() - synced
            self.service.version = step
        return update, sync_seconds

    def _run_step(self, step: int) -> int:
        """The step's number within this run (a run from a base checkpoint counts on from it)."""
        return step - self.job.base_step

    def _checkpoint(self, name: str) -> None:
        """The first process saves the checkpoint; every process takes part in gathering
        sharded weights (the first tells the others)."""
        first = self.collective.rank == 0
        if first:
            self.collective.broadcast(("checkpoint", name))
        reward = self.history[-1].mean_reward if self.history else None
        with scratch_folder() as scratch:
            folder, state = Path(scratch) / name, Path(scratch) / "trainer_state.pt"
            # Gathering a sharded model's weights frees those generation reads: it waits.
            with self.generator.lock if self.policy.sharded else contextlib.nullcontext():
                self.policy.save(folder, state=state, optimizer=self.optimizer, step=self.last_step)
            if not first:
                return
            self.store.save(
                folder, name=name, step=self.last_step, mean_reward=reward, state=state,
                keep=self.config.grpo.keep_checkpoints,
            )  # fmt: skip


class LlmEvaluator:
    """The baseline (the model training starts from) or final (training's last checkpoint)
    model answers the generate requests while the held-out records are played."""

    def __init__(
        self,
        job: TrainingJob,
        *,
        sqs: Any,
        s3: Any,
        workdir: Path,
        clock: Callable[[], float] = time.monotonic,
        collective: Collective = ALONE,
        adapters: Path | None = None,
    ) -> None:
        if job.evaluation is None:
            raise ValueError(f"run {job.run_id}: the job is not an evaluation")
        self.job, self.sqs, self.s3, self.clock = job, sqs, s3, clock
        self.collective = collective
        source = job.model_source or job.config.model
        weights = reads_weights(job.config, collective)
        checkpoint, self.version = None, 0
        if job.evaluation is EvaluationStage.FINAL:
            store = CheckpointStore(
                s3, bucket=job.bucket, output_prefix=job.output_prefix, model=job.config.model
            )
            final = [saved for saved in store.manifest.checkpoints if saved.name == FINAL]
            if not final:
                raise TrainingFailed(f"run {job.run_id} saved no final checkpoint to evaluate")
            checkpoint = download_model(
                s3, store.uri(final[-1]), workdir / "final", weights=weights
            )
            self.version = final[-1].step
        elif job.base is not None:
            checkpoint = download_model(s3, job.base.uri, workdir / "base", weights=weights)
            self.version = job.base_step
        policy = load_policy(
            source, job.config, s3=s3, workdir=workdir, checkpoint=checkpoint,
            collective=collective,
        )  # fmt: skip
        policy.model.eval()
        self.service = GenerationService(
            job, sqs=sqs, tokenizer=policy.tokenizer, generator=_generator(
                policy, job, adapters=adapters or workdir / "adapters",
                processes=collective.world_size,
            ),
            version=self.version,
        )  # fmt: skip

    def run(self) -> list[Episode]:
        """The first process plays the evaluation; every process answers generate requests
        until it says the end."""
        self.service.start()
        try:
            episodes = (
                []
                if self.collective.rank
                else play_evaluation(
                    self.s3,
                    self.sqs,
                    self.job,
                    clock=self.clock,
                    stopped=lambda: self.service.stopped,
                )  # fmt: skip
            )
            self.collective.broadcast(None)
            return episodes
        finally:
            self.service.stop()

    def stop(self) -> None:
        self.service.stop()
