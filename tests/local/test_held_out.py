"""The local trainer never trains on a held-out record, and its evaluation jobs play exactly
those: tested against a stand-in reward side that answers every rollout request the trainer
sends (the queues are a fake SQS; the dataset, checkpoints and episodes live in moto's S3)."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import boto3
import numpy as np
import pytest

from domain.checkpoints import BaseCheckpoint
from domain.dataset import DatasetRecord
from domain.episodes import Episode, EvaluationStage
from domain.evaluation import evaluation_records, held_out
from domain.protocol import Metric, RolloutRequest, RolloutResponse, dump, parse
from domain.run_queues import QueueKind
from domain.trainer_job import TrainingFailed, TrainingJob, evaluation_records_of
from local_trainer.checkpoints import (
    CheckpointMismatch,
    checkpoint_key,
    load_checkpoint,
    save_checkpoint,
)
from local_trainer.evaluation import Evaluator
from local_trainer.loop import Trainer
from local_trainer.policy import WordlePolicy
from training_configs.schema import load_training_config

BUCKET, KEY = "data", "training-data/w.jsonl"
QUEUES = {kind.value: f"https://sqs.local/{kind.value}.fifo" for kind in QueueKind}


class RewardSide:
    """A fake SQS: what goes to the rollout-request queue is answered at once on the
    rollout-response queue (a reward of 1 for even sample numbers, else 0, success with it),
    unless its record id is in `silent`; the generate queue is always empty."""

    def __init__(self, silent: set[str] = frozenset()) -> None:
        self.requests: list[RolloutRequest] = []
        self.silent = silent
        self._answers: list[dict[str, Any]] = []
        self._handles = itertools.count()
        self._idle = threading.Event()

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:  # noqa: N803
        assert QueueUrl == QUEUES["rollout_requests"]
        for entry in Entries:
            request = parse(RolloutRequest, entry["MessageBody"])
            self.requests.append(request)
            if request.record_id in self.silent:
                continue
            won = int(request.sample_id.rsplit("_", 1)[1]) % 2 == 0
            response = RolloutResponse(
                sample_id=request.sample_id,
                stop_reason="end_of_conversation",
                rewards={"aggregate_score": float(won)},
                metrics=[Metric(name="turns", value=3), Metric(name="env/success", value=won)],
            )
            self._answers.append(
                {"Body": dump(response), "ReceiptHandle": str(next(self._handles))}
            )
        return {"Successful": [], "Failed": []}

    def receive_message(self, *, QueueUrl: str, **_: Any) -> dict:  # noqa: N803
        if QueueUrl != QUEUES["rollout_responses"]:
            self._idle.wait(0.01)  # SQS's long poll of an empty queue, briefly
            return {}
        taken, self._answers = self._answers[:10], self._answers[10:]
        return {"Messages": taken}

    def delete_message_batch(self, **_: Any) -> dict:
        return {"Successful": [], "Failed": []}


def _records(n: int) -> list[DatasetRecord]:
    return [
        DatasetRecord.model_validate(
            {"id": f"game-{i}", "metadata": {"prompt": "Play.", "answer": "crane"}}
        )
        for i in range(n)
    ]


@pytest.fixture
def s3(aws: None) -> Any:
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    body = "".join(record.model_dump_json() + "\n" for record in _records(40))
    client.put_object(Bucket=BUCKET, Key=KEY, Body=body.encode())
    return client


def _job(evaluation: EvaluationStage | None = None, **config: Any) -> TrainingJob:
    settings = {
        "group_size": 2, "global_batch_size": 8, "max_steps": 3, "eval_fraction": 0.25,
        "eval_samples": 2, **config,
    }  # fmt: skip
    return TrainingJob(
        run_id="r", bucket=BUCKET, dataset_key=KEY, output_prefix="runs/r/", queues=QUEUES,
        config=load_training_config("rft_multiturn_lora").model_copy(update=settings),
        evaluation=evaluation,
    )  # fmt: skip


def _held_out(job: TrainingJob) -> set[str]:
    return {
        r.id
        for r in _records(40)
        if held_out(r.id, fraction=job.config.held_out_fraction, seed=job.config.eval_seed)
    }


def test_training_draws_only_records_that_are_not_held_out(s3: Any) -> None:
    job = _job(max_steps=12)
    side = RewardSide()
    history = Trainer(job, sqs=side, s3=s3, policy=WordlePolicy()).run()
    held = _held_out(job)
    assert 5 <= len(held) <= 15  # about a quarter of 40
    drawn = {request.record_id for request in side.requests}
    assert len(history) == 12 and len(side.requests) == 12 * 8
    assert drawn and not drawn & held
    assert len(drawn) > 15  # the draw covers the training records, not a few of them
    assert s3.get_object(Bucket=BUCKET, Key="runs/r/checkpoints/final.npz")


def test_a_dataset_held_out_whole_is_refused_with_the_fix(s3: Any) -> None:
    with pytest.raises(TrainingFailed, match=r"all 40 records .* are held out .* lower eval_frac"):
        Trainer(_job(eval_fraction=0.999), sqs=RewardSide(), s3=s3, policy=WordlePolicy()).run()


def test_the_baseline_evaluation_plays_each_held_out_record_k_times(s3: Any) -> None:
    job = _job(EvaluationStage.BASELINE)
    side = RewardSide()
    episodes = Evaluator(job, sqs=side, s3=s3, policy=WordlePolicy()).run()
    held = _held_out(job)
    assert {request.record_id for request in side.requests} == {f"eval-{r}" for r in held}
    assert len(episodes) == 2 * len(held) and {e.record_id for e in episodes} == held
    assert {e.score for e in episodes} == {0.0, 1.0} and all(
        e.success is not None for e in episodes
    )
    body = s3.get_object(Bucket=BUCKET, Key="runs/r/evaluation/baseline.jsonl")["Body"].read()
    assert [Episode.model_validate_json(line) for line in body.splitlines()] == episodes


def test_an_unanswered_rollout_is_kept_as_such_not_scored(s3: Any) -> None:
    job = _job(EvaluationStage.BASELINE, rollout_timeout_seconds=10)
    (silent, *_) = sorted(_held_out(job))
    ticks = itertools.count(0, 5.0)
    evaluator = Evaluator(
        job, sqs=RewardSide(silent={f"eval-{silent}"}), s3=s3, policy=WordlePolicy(),
        clock=lambda: next(ticks),
    )  # fmt: skip
    episodes = evaluator.run()
    lost = [e for e in episodes if e.record_id == silent]
    assert [e.stop_reason for e in lost] == ["no_response", "no_response"]
    assert all(e.score is None and "no rollout response within 40 s" in e.error for e in lost)


def test_the_final_evaluation_plays_the_saved_policy_and_refuses_another_policys(s3: Any) -> None:
    policy = WordlePolicy()
    trained = np.arange(len(policy.feature_names), dtype=float)
    key = checkpoint_key("runs/r/", "final")
    save_checkpoint(s3, bucket=BUCKET, key=key, policy=policy, params=trained, step=7)
    evaluator = Evaluator(_job(EvaluationStage.FINAL), sqs=RewardSide(), s3=s3, policy=policy)
    assert np.array_equal(evaluator.server.params, trained)
    assert load_checkpoint(s3, bucket=BUCKET, key=key, policy=policy)[1] == 7

    class Other(WordlePolicy):
        feature_names = ("consistent", "coverage")

    with pytest.raises(CheckpointMismatch, match="not this policy's"):
        Evaluator(_job(EvaluationStage.FINAL), sqs=RewardSide(), s3=s3, policy=Other())


def test_a_named_evaluation_file_is_evaluated_whole(s3: Any) -> None:
    s3.put_object(
        Bucket=BUCKET,
        Key="evaluation-data/e.jsonl",
        Body=b"".join(
            json.dumps(
                {"id": f"probe-{i}", "metadata": {"prompt": "Play.", "answer": "slate"}}
            ).encode()
            + b"\n"
            for i in range(3)
        ),
    )
    job = _job(EvaluationStage.BASELINE, eval_dataset="evaluation-data/e.jsonl", eval_fraction=None)
    assert [r.id for r in evaluation_records_of(s3, job)] == ["probe-0", "probe-1", "probe-2"]
    assert evaluation_records(_records(40), job.config, named_file=False) == []


def test_training_from_a_base_checkpoint_starts_from_its_policy_step_and_curve(s3: Any) -> None:
    policy = WordlePolicy()
    trained = np.linspace(-1, 1, len(policy.feature_names))
    key = checkpoint_key("runs/first-1/", "final")
    save_checkpoint(s3, bucket=BUCKET, key=key, policy=policy, params=trained, step=4)
    earlier = "".join(json.dumps({"step": n, "mean_reward": 0.1 * n}) + "\n" for n in range(1, 5))
    s3.put_object(Bucket=BUCKET, Key="runs/first-1/metrics.jsonl", Body=earlier.encode())
    base = BaseCheckpoint(uri=f"s3://{BUCKET}/{key}", run_id="first-1", step=4)
    job = _job(max_steps=2).model_copy(update={"base": base})
    trainer = Trainer(job, sqs=RewardSide(), s3=s3, policy=policy)
    assert np.array_equal(trainer.server.params, trained) and trainer.steps_before == 4
    assert [m.step for m in trainer.run()] == [5, 6]
    body = s3.get_object(Bucket=BUCKET, Key="runs/r/metrics.jsonl")["Body"].read().decode()
    assert [json.loads(line)["step"] for line in body.splitlines()] == [1, 2, 3, 4, 5, 6]
    baseline = Evaluator(
        job.model_copy(update={"evaluation": EvaluationStage.BASELINE}),
        sqs=RewardSide(), s3=s3, policy=policy,
    )  # fmt: skip
    assert np.array_equal(baseline.server.params, trained)  # the start it is compared with
