"""The open-weights trainer's loop, in-process: the reward side plays one-turn episodes through
its generation service (a fake SQS, tests/llm_trainer/fakes.py), the dataset, metrics and
checkpoints live in moto's S3. It learns; it checkpoints in Hugging Face format; a restarted job
resumes from its latest checkpoint with the same weights, optimizer state, step count and curve."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch

from domain.checkpoints import MANIFEST_OBJECT, CheckpointManifest
from domain.dataset import DatasetRecord
from domain.run_queues import QueueKind
from domain.trainer_job import TrainingJob
from llm_trainer.grpo import loss_settings
from llm_trainer.model import ModelNotLoaded
from llm_trainer.trainer import LlmTrainer
from tests.llm_trainer.fakes import QUEUES, EpisodeQueues
from training_configs.schema import load_training_config

BUCKET, KEY, PREFIX = "data", "training-data/letters.jsonl", "runs/r/"


def share_of_e(reply: str) -> float:
    text = "".join(reply.split())
    return text.count("e") / len(text) if text else 0.0


@pytest.fixture
def s3(aws: None) -> Any:
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    records = [
        DatasetRecord.model_validate(
            {"id": f"letters-{i}", "metadata": {"prompt": "Write e as often as you can."}}
        )
        for i in range(20)
    ]
    client.put_object(
        Bucket=BUCKET, Key=KEY, Body="".join(r.model_dump_json() + "\n" for r in records).encode()
    )
    return client


def job_for(prefix: str = PREFIX, **config: Any) -> TrainingJob:
    """A job of the config's settings writing under `prefix`."""
    settings = {
        "group_size": 8, "global_batch_size": 16, "max_steps": 2, "learning_rate": 1e-2,
        "max_new_tokens": 16, "max_length": 256, "eval_fraction": 0.2,
        "grpo": {"checkpoint_every": 1, "micro_batch_size": 8}, **config,
    }  # fmt: skip
    return TrainingJob(
        run_id="r", bucket=BUCKET, dataset_key=KEY, output_prefix=prefix, queues=QUEUES,
        config=load_training_config("rft_multiturn_full").model_validate(
            {**load_training_config("rft_multiturn_full").model_dump(), **settings}
        ),
        model_source="tiny",
    )  # fmt: skip


def metrics_lines(s3: Any) -> list[dict[str, Any]]:
    body = s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}metrics.jsonl")["Body"].read().decode()
    return [json.loads(line) for line in body.splitlines()]


def test_the_reward_rises_on_a_task_the_tiny_model_can_learn(s3: Any, tmp_path: Path) -> None:
    trainer = LlmTrainer(
        job_for(max_steps=20), sqs=EpisodeQueues(share_of_e), s3=s3, workdir=tmp_path
    )
    history = trainer.run()
    rewards = [step.mean_reward for step in history]
    assert len(rewards) == 20 and all(r is not None for r in rewards)
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > 5 * first, rewards
    lines = metrics_lines(s3)
    assert [line["step"] for line in lines] == list(range(1, 21))
    # The metrics schema local mode writes, and what this trainer adds.
    assert {"mean_reward", "truncated_rollouts", "zero_variance_groups", "rollouts_asked",
            "objective", "clipped_fraction", "started_at", "finished_at"} <= set(lines[0])  # fmt: skip
    assert all(line["sampled_tokens"] > 0 and line["weight_sync_seconds"] >= 0 for line in lines)


def test_a_restarted_job_resumes_from_its_latest_checkpoint(s3: Any, tmp_path: Path) -> None:
    first = LlmTrainer(
        job_for(max_steps=2), sqs=EpisodeQueues(share_of_e), s3=s3, workdir=tmp_path / "a"
    )
    first.run()
    manifest = CheckpointManifest.model_validate_json(
        s3.get_object(Bucket=BUCKET, Key=f"{PREFIX}{MANIFEST_OBJECT}")["Body"].read()
    )
    assert [(c.name, c.step) for c in manifest.checkpoints] == [
        ("step-000001", 1),
        ("step-000002", 2),
        ("final", 2),
    ]
    assert manifest.base_model == "tiny"  # what a LoRA adapter would be served on
    saved = {item["Key"].removeprefix(f"{PREFIX}checkpoints/step-000002/")
             for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}checkpoints/step-000002/")["Contents"]}  # fmt: skip
    # A folder a server loads as it is; the optimizer's state beside it.
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= saved
    assert not any(name.endswith(".pt") for name in saved)
    state = s3.head_object(Bucket=BUCKET, Key=f"{PREFIX}checkpoints/trainer-state/step-000002.pt")
    assert state["ContentLength"] > 0
    # The job died during step 3, after its metrics line, before its checkpoint.
    lines = metrics_lines(s3)
    died = [*lines, {**lines[-1], "step": 3}]
    s3.put_object(
        Bucket=BUCKET, Key=f"{PREFIX}metrics.jsonl",
        Body="".join(json.dumps(line) + "\n" for line in died).encode(),
    )  # fmt: skip
    queues = EpisodeQueues(share_of_e)
    second = LlmTrainer(job_for(max_steps=3), sqs=queues, s3=s3, workdir=tmp_path / "b")
    assert second.steps_before == 2
    for (name, mine), (_, theirs) in zip(
        second.policy.model.named_parameters(), first.policy.model.named_parameters(), strict=True
    ):
        assert torch.equal(mine, theirs), name
    resumed, original = second.optimizer.state_dict(), first.optimizer.state_dict()
    assert resumed["param_groups"] == original["param_groups"]
    for index, state in original["state"].items():
        assert int(resumed["state"][index]["step"]) == int(state["step"]) == 2
        assert torch.equal(resumed["state"][index]["exp_avg"], state["exp_avg"])
    history = second.run()
    assert [step.step for step in history] == [3]
    # Step 3 draws what it would have drawn without the restart: its own sample numbers.
    numbers = sorted(int(r.sample_id.rsplit("_", 1)[1]) for r in queues.rollout_requests)
    assert numbers == list(range(32, 48))
    assert [line["step"] for line in metrics_lines(s3)] == [1, 2, 3]
    assert metrics_lines(s3)[:2] == lines  # the curve before the restart, as it was


def test_a_model_that_cannot_be_loaded_is_said_by_name(s3: Any, tmp_path: Path) -> None:
    job = job_for().model_copy(update={"model_source": str(tmp_path / "missing")})
    with pytest.raises(ModelNotLoaded, match=f"model {tmp_path / 'missing'}"):
        LlmTrainer(job, sqs=EpisodeQueues(share_of_e), s3=s3, workdir=tmp_path)


def test_a_lora_checkpoint_cannot_start_a_full_run_or_the_other_way(
    s3: Any, tmp_path: Path
) -> None:
    from llm_trainer.model import load_policy

    full = load_policy("tiny", job_for().config, s3=s3, workdir=tmp_path)
    full.model.save_pretrained(tmp_path / "full")
    lora_config = load_training_config("rft_multiturn_lora")
    with pytest.raises(ModelNotLoaded, match="has no LoRA adapter"):
        load_policy("tiny", lora_config, s3=s3, workdir=tmp_path, checkpoint=tmp_path / "full")


class Watched(EpisodeQueues):
    """Episode queues that note, in the trainer's order, which step's rollouts it sent."""

    def __init__(self, events: list[tuple[str, int]]) -> None:
        super().__init__(share_of_e)
        self.events = events

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:  # noqa: N803
        if QueueUrl == QUEUES[QueueKind.ROLLOUT_REQUESTS] and Entries:
            number = int(json.loads(Entries[0]["MessageBody"])["sample_id"].rsplit("_", 1)[1])
            step = number // 16 + 1  # 16 rollouts a step
            if ("send", step) not in self.events:
                self.events.append(("send", step))
        return super().send_message_batch(QueueUrl=QueueUrl, Entries=Entries)


@pytest.mark.parametrize(
    ("ahead", "expected"),
    [
        (0, ["send 1", "update 1", "send 2", "update 2", "send 3", "update 3"]),
        (1, ["send 1", "send 2", "update 1", "send 3", "update 2", "update 3"]),
        (2, ["send 1", "send 2", "send 3", "update 1", "update 2", "update 3"]),
    ],
)
def test_max_off_policy_steps_plays_that_many_steps_ahead_of_training(
    s3: Any, tmp_path: Path, ahead: int, expected: list[str]
) -> None:
    events: list[tuple[str, int]] = []
    grpo = {"checkpoint_every": 10, "micro_batch_size": 8, "max_off_policy_steps": ahead}
    trainer = LlmTrainer(
        job_for(max_steps=3, grpo=grpo), sqs=Watched(events), s3=s3, workdir=tmp_path
    )
    update = trainer._update

    def noted(step: int, played: Any, **options: Any) -> None:
        events.append(("update", step))
        update(step, played, **options)

    trainer._update = noted  # type: ignore[method-assign]
    history = trainer.run()
    assert [f"{what} {step}" for what, step in events] == expected
    # Every rollout came back and trained: none was older than the bound allows.
    assert [step.stats.rollouts for step in history] == [16, 16, 16]
    assert all(line["stale_rollouts"] == 0 for line in metrics_lines(s3))
    versions = {
        int(r.sample_id.rsplit("_", 1)[1]) // 16 + 1: set() for r in trainer.sqs.generate_responses
    }
    for response in trainer.sqs.generate_responses:
        step = int(response.sample_id.rsplit("_", 1)[1]) // 16 + 1
        versions[step].add(response.data.policy_version)
    # A step's episodes were written by the weights of the moment: at most `ahead` behind.
    for step, seen in versions.items():
        assert seen <= set(range(max(0, step - 1 - ahead), step)), (step, seen)


def test_a_resumed_run_keeps_pulling_towards_the_weights_it_started_from(
    s3: Any, tmp_path: Path
) -> None:
    """Full fine-tuning with a KL term: after an automatic restart the reference is still the
    starting model (here the tiny one), not the checkpoint the job resumed from."""
    from llm_trainer.grpo import next_token_logprobs
    from llm_trainer.logprobs import SamplingDistribution
    from llm_trainer.tiny import tiny_model, tiny_tokenizer

    LlmTrainer(
        job_for(max_steps=2, kl_coefficient=0.1), sqs=EpisodeQueues(share_of_e), s3=s3,
        workdir=tmp_path / "a",
    ).run()  # fmt: skip
    resumed = LlmTrainer(
        job_for(max_steps=3, kl_coefficient=0.1), sqs=EpisodeQueues(share_of_e), s3=s3,
        workdir=tmp_path / "b",
    )  # fmt: skip
    assert resumed.steps_before == 2 and resumed.reference is not None
    ids = torch.tensor([[264, 84, 82, 257, 198, 101, 102]])
    attention = torch.ones_like(ids)
    settings = loss_settings(resumed.config)
    starting = next_token_logprobs(
        tiny_model(tiny_tokenizer(), seed=0), ids, attention, SamplingDistribution()
    )
    with torch.no_grad():
        policy = next_token_logprobs(resumed.policy.model, ids, attention, SamplingDistribution())
    assert not torch.allclose(policy, starting, atol=1e-4)  # training moved the policy
    assert torch.allclose(resumed.reference.logprobs(ids, attention, settings), starting, atol=1e-6)


def test_truncated_rollouts_leave_the_objective_when_asked_to(s3: Any, tmp_path: Path) -> None:
    """Replies cut at two tokens, scored so that groups vary: with
    `truncated_rollouts: mask` no rollout trains and the count says why; with `penalise` each
    learns from its group's lowest reward, so no group varies; by default they train."""

    def of_reply(reply: str) -> float:
        return float(sum(map(ord, reply)) % 7)  # any score that varies with the reply

    cut = {"max_new_tokens": 2, "max_steps": 1}
    masked = LlmTrainer(
        job_for(**cut, grpo={"micro_batch_size": 8, "truncated_rollouts": "mask"}),
        sqs=EpisodeQueues(of_reply), s3=s3, workdir=tmp_path / "m",
    )  # fmt: skip
    (step,) = masked.run()
    assert step.update is None
    assert step.extra["truncated_rollouts_masked"] == step.stats.truncated_rollouts > 0
    penalised = LlmTrainer(
        job_for("runs/p/", **cut, grpo={"micro_batch_size": 8, "truncated_rollouts": "penalise"}),
        sqs=EpisodeQueues(of_reply), s3=s3, workdir=tmp_path / "p",
    )  # fmt: skip
    (step,) = penalised.run()
    assert step.update is None and step.stats.zero_variance_groups == 1.0
    assert step.extra["flat_group_rollouts_skipped"] == step.stats.rollouts > 0
    assert step.stats.reward_std > 0  # the rewards reported are the rollouts' own
    trained = LlmTrainer(
        job_for("runs/t/", **cut), sqs=EpisodeQueues(of_reply), s3=s3, workdir=tmp_path / "t"
    )
    (step,) = trained.run()
    assert step.update is not None and step.extra["truncated_rollouts_masked"] == 0


def test_groups_that_all_scored_the_same_are_skipped_and_counted(s3: Any, tmp_path: Path) -> None:
    def same_for_all(_: str) -> float:
        return 0.5

    skipping = LlmTrainer(
        job_for(max_steps=1), sqs=EpisodeQueues(same_for_all), s3=s3, workdir=tmp_path / "s"
    )
    (step,) = skipping.run()
    assert step.update is None
    assert step.extra["flat_group_rollouts_skipped"] == step.stats.rollouts == 16
    keeping = LlmTrainer(
        job_for("runs/k/", max_steps=1, grpo={"micro_batch_size": 8, "skip_zero_variance_groups": False}),
        sqs=EpisodeQueues(same_for_all), s3=s3, workdir=tmp_path / "k",
    )  # fmt: skip
    (step,) = keeping.run()
    assert step.update is not None and step.update.objective == 0.0
    assert step.extra["flat_group_rollouts_skipped"] == 0


def test_the_learning_rate_warms_up_then_follows_its_schedule(s3: Any, tmp_path: Path) -> None:
    grpo = {"micro_batch_size": 8, "warmup_steps": 2, "learning_rate_schedule": "cosine"}
    trainer = LlmTrainer(
        job_for(max_steps=4, learning_rate=1e-3, grpo=grpo), sqs=EpisodeQueues(share_of_e),
        s3=s3, workdir=tmp_path,
    )  # fmt: skip
    history = trainer.run()
    # Warm-up: 1/2, 2/2 of the rate; then cos decay over the two steps left, from the top.
    expected = [5e-4, 1e-3, 1e-3, 1e-3 * 0.5 * (1 + math.cos(math.pi / 2))]
    assert [step.extra["learning_rate"] for step in history] == pytest.approx(expected)
    line = metrics_lines(s3)[-1]
    assert line["learning_rate"] == pytest.approx(expected[-1])
    assert {"grad_norm", "mismatch_kl", "entropy", "ratio_p99", "masked_fraction"} <= set(line)


def test_dynamic_sampling_replaces_groups_without_signal_within_its_bound(
    s3: Any, tmp_path: Path
) -> None:
    """The step's two groups all score 0.5 (no signal): with `refill_rounds: 2` two new groups
    are played by the same weights — their sample numbers past every step's of the run — and
    the update learns from them; the flat ones are skipped and counted."""
    answered = []

    def flat_then_varied(reply: str) -> float:
        answered.append(reply)
        return 0.5 if len(answered) <= 16 else float(sum(map(ord, reply)) % 7)

    queues = EpisodeQueues(flat_then_varied)
    trainer = LlmTrainer(
        job_for(max_steps=1, grpo={"micro_batch_size": 8, "refill_rounds": 2}), sqs=queues,
        s3=s3, workdir=tmp_path,
    )  # fmt: skip
    (step,) = trainer.run()
    assert step.extra["refilled_groups"] == 2
    assert step.stats.rollouts_asked == 32
    assert step.extra["flat_group_rollouts_skipped"] == 16
    assert step.update is not None
    numbers = sorted(int(r.sample_id.rsplit("_", 1)[1]) for r in queues.rollout_requests)
    assert numbers == list(range(32))  # the step's 0-15, the refill's 16-31 (one step planned)
