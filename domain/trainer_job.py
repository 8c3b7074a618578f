"""A trainer's side of a run: the job it is handed (the documented run configuration, the same
for the local policy and the open-weights trainer), and the rollout protocol's exchange it
drives — send rollout requests, collect their responses under the run's timeout — with the
run's dataset read as it is.

On AWS the open-weights trainer gets the job as JSON in `MTRL_TRAINING_JOB` from the run's
Kubernetes job; locally the local training cluster hands it over the same way."""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from domain.backends import METRICS_OBJECT, RunContext
from domain.bucket import object_exists, run_output_prefix
from domain.checkpoints import BaseCheckpoint
from domain.dataset import DatasetRecord, read_dataset_object
from domain.episodes import Episode, EvaluationStage
from domain.evaluation import (
    evaluation_records,
    evaluation_sample_id,
    evaluation_source,
    training_records,
    write_episodes,
)
from domain.grpo import StepMetrics
from domain.protocol import (
    ProtocolError,
    RewardSpec,
    RolloutRequest,
    RolloutResponse,
    dump,
    fifo_id,
    parse,
    sample_id_for,
)
from domain.run_queues import QueueKind
from domain.step_metrics import metrics_lines
from training_configs.schema import TrainingConfig

log = logging.getLogger("mtrl.trainer")
JOB_VARIABLE = "MTRL_TRAINING_JOB"
# Rollouts' time to come back, beyond the config's rollout timeout: the workers' queue polls.
COLLECT_SLACK_SECONDS = 30


class TrainingJob(BaseModel):
    """What the training cluster hands the trainer: training, or with `evaluation` the
    evaluation of the starting (baseline) or trained (final) policy."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    bucket: str
    dataset_key: str
    dataset_version: str | None = None
    output_prefix: str
    queues: dict[str, str]
    config: TrainingConfig
    reward_range: tuple[float, float] = (0.0, 1.0)
    seed: int = 0
    evaluation: EvaluationStage | None = None
    base: BaseCheckpoint | None = None  # the checkpoint training starts from
    # Where an open-weights trainer loads the model: a directory, s3://…, a Hugging Face Hub id,
    # or `tiny` (a small model built on the spot). None: the config's `model`.
    model_source: str | None = None
    # The Secrets Manager secret holding a Hugging Face token (a gated model_source): its name,
    # never the token.
    hub_token_secret: str | None = None

    @classmethod
    def for_run(
        cls,
        run: RunContext,
        *,
        evaluation: EvaluationStage | None = None,
        model_source: str | None = None,
        reward_range: tuple[float, float] = (0.0, 1.0),
        seed: int = 0,
    ) -> TrainingJob:
        """The job of a run: its training, or with `evaluation` that evaluation."""
        return cls(
            run_id=run.run_id,
            bucket=run.bucket,
            dataset_key=run.dataset_key,
            dataset_version=run.dataset_version,
            output_prefix=run.output_prefix,
            queues=run.queues,
            config=run.training,
            reward_range=reward_range,
            seed=seed,
            evaluation=evaluation,
            base=run.base,
            model_source=model_source,
        )

    def rollout_request(self, record: DatasetRecord, sample_id: str) -> RolloutRequest:
        """The rollout request of one sample of `record`, for training or evaluation alike."""
        return RolloutRequest(
            sample_id=sample_id,
            max_length=self.config.max_length,
            rewards=RewardSpec(range=self.reward_range),
            data=record.rollout_data(),
        )

    @property
    def base_step(self) -> int:
        """The steps the checkpoint it starts from had been trained (0 for a fresh start)."""
        return (self.base.step or 0) if self.base else 0


class TrainingFailed(RuntimeError):
    """The trainer cannot go on; the message says why."""


def read_dataset(s3: Any, *, bucket: str, key: str, version: str | None) -> list[DatasetRecord]:
    records = read_dataset_object(s3, bucket=bucket, key=key, version=version)
    if not records:
        raise TrainingFailed(f"s3://{bucket}/{key} has no records")
    return records


def send_rollouts(sqs: Any, url: str, requests: list[RolloutRequest]) -> None:
    for start in range(0, len(requests), 10):
        sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {
                    "Id": str(i),
                    "MessageBody": dump(request),
                    "MessageGroupId": fifo_id(request.sample_id),
                    "MessageDeduplicationId": fifo_id(request.sample_id),
                }
                for i, request in enumerate(requests[start : start + 10])
            ],
        )


class RolloutInbox:
    """The run's rollout responses for the samples in flight (`expect`): an answer for a sample
    of a later step is kept until that step is collected; one for no sample in flight (late for a
    step already scored, or malformed) is dropped."""

    def __init__(self, sqs: Any, url: str) -> None:
        self.sqs, self.url = sqs, url
        self._expected: set[str] = set()
        self._arrived: dict[str, RolloutResponse] = {}

    def expect(self, samples: Iterable[str]) -> None:
        self._expected |= set(samples)

    def collect(
        self,
        samples: set[str],
        *,
        deadline: float,
        clock: Callable[[], float],
        stopped: Callable[[], bool],
    ) -> dict[str, RolloutResponse]:
        """The responses of `samples`, until all are in, the deadline passes or the job stops;
        after this, answers for them are late and dropped."""
        while not samples <= self._arrived.keys() and clock() < deadline and not stopped():
            messages = self.sqs.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", [])
            for message in messages:
                try:
                    response = parse(RolloutResponse, message["Body"])
                except ProtocolError as error:
                    log.warning("dropping a malformed rollout response: %s", error)
                    continue
                if response.sample_id in self._expected:
                    self._arrived[response.sample_id] = response
            if messages:
                delete_messages(self.sqs, self.url, messages)
        self._expected -= samples
        return {sample: self._arrived.pop(sample) for sample in samples if sample in self._arrived}


def collect_window(job: TrainingJob) -> float:
    """How long a batch's rollout responses are waited for from when it was sent: the rollout
    timeout and the queues' slack."""
    return job.config.rollout_timeout_seconds + COLLECT_SLACK_SECONDS


def exchange_rollouts(
    sqs: Any,
    job: TrainingJob,
    requests: list[RolloutRequest],
    *,
    started: float,
    clock: Callable[[], float],
    stopped: Callable[[], bool],
) -> tuple[dict[str, RolloutResponse], float]:
    """Send `requests` to the run's workers and collect their responses for the collect window
    from `started` (answers of other samples, late ones of an earlier batch, are dropped): the
    responses, and that wait in seconds."""
    inbox = RolloutInbox(sqs, job.queues[QueueKind.ROLLOUT_RESPONSES])
    samples = {request.sample_id for request in requests}
    inbox.expect(samples)
    send_rollouts(sqs, job.queues[QueueKind.ROLLOUT_REQUESTS], requests)
    waited = collect_window(job)
    responses = inbox.collect(samples, deadline=started + waited, clock=clock, stopped=stopped)
    return responses, waited


def delete_messages(sqs: Any, url: str, messages: list[dict[str, Any]]) -> None:
    sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ],
    )


def training_records_of(s3: Any, job: TrainingJob) -> list[DatasetRecord]:
    """The dataset's records but the ones held out for evaluation."""
    records = read_dataset(s3, bucket=job.bucket, key=job.dataset_key, version=job.dataset_version)
    kept = training_records(records, job.config)
    if not kept:
        raise TrainingFailed(
            f"all {len(records)} records of s3://{job.bucket}/{job.dataset_key} are held out "
            f"for evaluation (eval_fraction {job.config.held_out_fraction}); add records or "
            "lower eval_fraction"
        )
    log.info("training on %d records, %d held out", len(kept), len(records) - len(kept))
    return kept


def earlier_metrics(s3: Any, job: TrainingJob) -> list[dict[str, Any]]:
    """The metrics lines of the run a job continues (none for a fresh start or an S3 URI)."""
    if job.base is None or job.base.run_id is None:
        return []
    return metrics_lines_of(s3, bucket=job.bucket, output_prefix=run_output_prefix(job.base.run_id))


def metrics_lines_of(s3: Any, *, bucket: str, output_prefix: str) -> list[dict[str, Any]]:
    """A run's metrics lines as its trainer wrote them (none when it wrote none)."""
    key = f"{output_prefix}{METRICS_OBJECT}"
    if not object_exists(s3, bucket=bucket, key=key):
        return []
    return metrics_lines(s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode())


def publish_step(
    s3: Any,
    job: TrainingJob,
    *,
    earlier: list[dict[str, Any]],
    history: list[StepMetrics],
    last: int,
    out: TextIO | None,
) -> None:
    """A trainer's step made known: the run's metrics object rewritten with every line (those
    of the run it continues, then its own steps), and the newest step as a JSON line on `out`
    (a local trainer's progress), with the step the run ends at."""
    lines = [*earlier, *(metrics.line() for metrics in history)]
    s3.put_object(
        Bucket=job.bucket,
        Key=f"{job.output_prefix}{METRICS_OBJECT}",
        Body="".join(json.dumps(line) + "\n" for line in lines).encode(),
        ContentType="application/x-ndjson",
    )
    print_step(history[-1], last=last, out=out)


def print_step(metrics: StepMetrics, *, last: int, out: TextIO | None) -> None:
    """A trainer's step as one JSON line on `out` (a local trainer's progress), with the step
    the run ends at."""
    if out is not None:
        print(json.dumps({"event": "step", **metrics.line(), "of": last}), file=out, flush=True)


def evaluation_records_of(s3: Any, job: TrainingJob) -> list[DatasetRecord]:
    """The records an evaluation job plays: the named evaluation file's, or those held out."""
    config = job.config
    key, version = evaluation_source(config, job.dataset_key, job.dataset_version)
    records = read_dataset(s3, bucket=job.bucket, key=key, version=version)
    return evaluation_records(records, config, named_file=config.eval_dataset is not None)


def play_evaluation(
    s3: Any,
    sqs: Any,
    job: TrainingJob,
    *,
    clock: Callable[[], float],
    stopped: Callable[[], bool],
) -> list[Episode]:
    """An evaluation job's rollouts, with the policy being served meanwhile by the caller: every
    held-out record `eval_samples` times, a training step's worth at a time, through the same
    queues, router and workers as training. The episodes go, one JSON line each, to the run's
    `evaluation/<stage>.jsonl`."""
    stage, config = job.evaluation, job.config
    if stage is None:
        raise ValueError(f"run {job.run_id}: the job is not an evaluation")
    records = evaluation_records_of(s3, job)
    planned = [
        (record, evaluation_sample_id(record.id, stage, number, config.eval_samples))
        for record in records
        for number in range(config.eval_samples)
    ]
    episodes: list[Episode] = []
    for start in range(0, len(planned), config.global_batch_size):
        if stopped():
            break
        batch = planned[start : start + config.global_batch_size]
        requests = [job.rollout_request(record, sample) for record, sample in batch]
        responses, waited = exchange_rollouts(
            sqs, job, requests, started=clock(), clock=clock, stopped=stopped
        )
        episodes += [
            Episode.of(record.id, responses[sample])
            if sample in responses
            else Episode.unanswered(record.id, sample, waited)
            for record, sample in batch
        ]
    write_episodes(
        s3, bucket=job.bucket, output_prefix=job.output_prefix, stage=stage, episodes=episodes
    )
    log.info("%s evaluation: %d rollouts of %d records", stage, len(episodes), len(records))
    return episodes


@dataclass(frozen=True)
class PlayedStep:
    """A training step's rollouts: the samples asked per group, the responses that came back,
    and when the step started (monotonic clock, wall clock)."""

    groups: dict[str, list[str]]
    responses: dict[str, RolloutResponse]
    started: float
    started_at: float

    @property
    def samples(self) -> set[str]:
        return {sample for samples in self.groups.values() for sample in samples}


def step_requests(
    job: TrainingJob, records: list[DatasetRecord], step: int, rng: np.random.Generator
) -> tuple[dict[str, list[str]], list[RolloutRequest]]:
    """`global_batch_size / group_size` records drawn for `step`, `group_size` rollout requests
    each, with sample ids unique in the run (`<record id>_<n>`)."""
    wanted = job.config.global_batch_size // job.config.group_size
    return _group_requests(job, records, rng, count=wanted, first=(step - 1) * wanted, key="")


def refill_requests(
    job: TrainingJob,
    records: list[DatasetRecord],
    step: int,
    round_: int,
    count: int,
    rng: np.random.Generator,
) -> tuple[dict[str, list[str]], list[RolloutRequest]]:
    """`count` (at most a step's) more records drawn for `step`'s refill `round_` (from 1, at
    most `grpo.refill_rounds`), their groups keyed `r<round>-<slot>`, their sample numbers
    past every step's of the run, so unique in it too."""
    wanted = job.config.global_batch_size // job.config.group_size
    steps, rounds = job.base_step + job.config.max_steps, job.config.grpo.refill_rounds
    first = steps * wanted + ((step - 1) * rounds + round_ - 1) * wanted
    return _group_requests(job, records, rng, count=count, first=first, key=f"r{round_}-")


def _group_requests(
    job: TrainingJob,
    records: list[DatasetRecord],
    rng: np.random.Generator,
    *,
    count: int,
    first: int,
    key: str,
) -> tuple[dict[str, list[str]], list[RolloutRequest]]:
    """`count` records drawn, a group of `group_size` requests each, the groups numbered from
    `first` (sample n of group g: `g × group_size + n`)."""
    group_size = job.config.group_size
    chosen = rng.choice(len(records), size=count, replace=len(records) < count)
    groups: dict[str, list[str]] = {}
    requests = []
    for slot, index in enumerate(chosen):
        record = records[int(index)]
        samples = [sample_id_for(record.id, (first + slot) * group_size + k) for k in range(group_size)]  # fmt: skip
        groups[f"{key}{slot}"] = samples
        requests += [job.rollout_request(record, sample) for sample in samples]
    return groups, requests


def send_step(
    sqs: Any,
    job: TrainingJob,
    records: list[DatasetRecord],
    step: int,
    rng: np.random.Generator,
    *,
    inbox: RolloutInbox,
    record: Callable[[Iterable[str]], None],
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
) -> PlayedStep:
    """Send a step's rollout requests, after the generate side (`record`) and the inbox are
    told their samples: the step in flight, no responses yet."""
    started, started_at = clock(), wall_clock()
    groups, requests = step_requests(job, records, step, rng)
    send_groups(sqs, job, requests, inbox=inbox, record=record)
    return PlayedStep(groups, {}, started, started_at)


def send_groups(
    sqs: Any,
    job: TrainingJob,
    requests: list[RolloutRequest],
    *,
    inbox: RolloutInbox,
    record: Callable[[Iterable[str]], None],
) -> None:
    """Rollout requests sent once the generate side (`record`) and the inbox know them."""
    samples = [request.sample_id for request in requests]
    record(samples)
    inbox.expect(samples)
    send_rollouts(sqs, job.queues[QueueKind.ROLLOUT_REQUESTS], requests)


def await_step(
    job: TrainingJob,
    inbox: RolloutInbox,
    sent: PlayedStep,
    *,
    clock: Callable[[], float],
    stopped: Callable[[], bool],
) -> PlayedStep:
    """The responses of a step in flight, collected for the collect window from when it was
    sent; TrainingFailed when none came back while the job was running."""
    waited = collect_window(job)
    responses = inbox.collect(
        sent.samples, deadline=sent.started + waited, clock=clock, stopped=stopped
    )
    if not responses and not stopped():
        raise TrainingFailed(
            f"no rollout responses within {waited} s; "
            "are the reward workers running and reaching the router?"
        )
    return PlayedStep(sent.groups, responses, sent.started, sent.started_at)


def play_step(
    sqs: Any,
    job: TrainingJob,
    records: list[DatasetRecord],
    step: int,
    rng: np.random.Generator,
    *,
    record: Callable[[Iterable[str]], None],
    clock: Callable[[], float],
    wall_clock: Callable[[], float],
    stopped: Callable[[], bool],
) -> PlayedStep:
    """A step sent and its responses collected before anything else (a synchronous step)."""
    inbox = RolloutInbox(sqs, job.queues[QueueKind.ROLLOUT_RESPONSES])
    sent = send_step(
        sqs, job, records, step, rng, inbox=inbox, record=record, clock=clock,
        wall_clock=wall_clock,
    )  # fmt: skip
    return await_step(job, inbox, sent, clock=clock, stopped=stopped)


class JobUnreadable(ValueError):
    """`MTRL_TRAINING_JOB` is missing or not a training job; the message says where."""


def job_from_environment(environ: Mapping[str, str]) -> TrainingJob:
    try:
        return TrainingJob.model_validate_json(environ.get(JOB_VARIABLE, ""))
    except ValidationError as error:
        problem = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in problem["loc"]) or "job"
        raise JobUnreadable(f"{JOB_VARIABLE}: {where}: {problem['msg']}") from None


class Work(Protocol):
    def run(self) -> object: ...

    def stop(self) -> None: ...


def run_to_the_end(work: Work, *, failures: tuple[type[Exception], ...] = ()) -> int:
    """A trainer process's job, to its end: SIGTERM or SIGINT stop it cleanly (exit 0, as after
    the last step); a failure it reports is one line on stderr and exit 1."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: work.stop())
    try:
        work.run()
    except (TrainingFailed, *failures) as error:
        print(f"trainer: {error}", file=sys.stderr)
        return 1
    print('{"event": "done"}', flush=True)
    return 0
