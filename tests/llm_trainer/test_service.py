"""The generation service answers the run's generate requests in the protocol's v0 shape, as
the router and the reward workers read them: tested through moto's SQS (FIFO queues as the run
has them), with the tiny model generating."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
import torch

from domain.protocol import GenerateRequest, GenerateResponse, dump, fifo_id, parse
from domain.run_queues import QueueKind
from domain.trainer_job import TrainingJob
from llm_trainer.generation import TransformersGenerator
from llm_trainer.service import GenerationService, render_prompt
from reward_envs.worker.model_client import model_turn
from tests.llm_trainer.fakes import QUEUES
from training_configs.schema import load_training_config


def job_for(queues: dict[str, str] = QUEUES, **config: Any) -> TrainingJob:
    settings = load_training_config("rft_multiturn_full").model_copy(
        update={"max_new_tokens": 12, "max_length": 512, **config}
    )
    return TrainingJob(
        run_id="r", bucket="data", dataset_key="training-data/d.jsonl", output_prefix="runs/r/",
        queues=queues, config=settings, model_source="tiny",
    )  # fmt: skip


def service_for(
    job: TrainingJob, tokenizer: Any, model: Any, version: int = 0
) -> GenerationService:
    generator = TransformersGenerator(
        model, stop_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
    )
    return GenerationService(
        job, sqs=boto3.client("sqs"), tokenizer=tokenizer, generator=generator, version=version
    )


def send(queues: dict[str, str], body: str, step_id: str) -> None:
    boto3.client("sqs").send_message(
        QueueUrl=queues[QueueKind.GENERATE_REQUESTS],
        MessageBody=body,
        MessageGroupId=fifo_id("s"),
        MessageDeduplicationId=fifo_id(step_id),
    )


def received(queues: dict[str, str], kind: QueueKind) -> list[dict[str, Any]]:
    return (
        boto3.client("sqs")
        .receive_message(QueueUrl=queues[kind], MaxNumberOfMessages=10)
        .get("Messages", [])
    )


REQUEST = GenerateRequest(
    sample_id="s",
    step_id="s_0",
    messages=[
        {"role": "system", "content": "Play Wordle."},
        {"role": "user", "content": "Your first guess?"},
    ],
)


def test_a_generate_request_is_answered_in_the_v0_shape(
    queues: dict[str, str], tokenizer: Any, model: Any
) -> None:
    service = service_for(job_for(queues), tokenizer, model, version=3)
    send(queues, dump(REQUEST), "s_0")
    service.answer(received(queues, QueueKind.GENERATE_REQUESTS))
    [message] = received(queues, QueueKind.GENERATE_RESPONSES)
    response = parse(GenerateResponse, message["Body"])
    raw = json.loads(message["Body"])
    assert (raw["version"], raw["sample_id"], raw["step_id"]) == ("v0", "s", "s_0")
    choice = response.data.choices[0]
    tokens = choice.logprobs["content"]
    sampled = [int(token.token.removeprefix("token_id:")) for token in tokens]
    assert all(token.token.startswith("token_id:") for token in tokens)
    # The text is the sampled tokens decoded; a random model rarely ends its turn in 12 tokens.
    assert choice.message.content == tokenizer.decode(sampled, skip_special_tokens=True)
    assert len(sampled) == 12 and choice.finish_reason == response.finish_reason == "length"
    # Each log-probability is the model's own for that token after that prompt.
    prompt = render_prompt(tokenizer, REQUEST)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + sampled])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(sampled)[:, None])[:, 0]
    assert [token.logprob for token in tokens] == pytest.approx(expected.tolist(), abs=1e-4)
    # The reward worker reads what it needs for trajectories and truncation from it.
    turn = model_turn(response.data.model_dump(), "s_0")
    assert (turn.finish_reason, turn.policy_version) == ("length", 3)
    # Answered requests leave the queue.
    assert received(queues, QueueKind.GENERATE_REQUESTS) == []
    assert service.counters.answered == 1


def test_a_malformed_request_is_counted_and_left_for_the_dead_letter_queue(
    queues: dict[str, str], tokenizer: Any, model: Any
) -> None:
    service = service_for(job_for(queues), tokenizer, model)
    send(queues, '{"version": "v0", "sample_id": "s"}', "bad")
    service.answer(received(queues, QueueKind.GENERATE_REQUESTS))
    assert service.counters.malformed == 1 and service.counters.answered == 0
    assert received(queues, QueueKind.GENERATE_RESPONSES) == []
    # Not deleted: redelivered until the queue's receive limit sends it to its DLQ.
    assert len(received(queues, QueueKind.GENERATE_REQUESTS)) == 1


def test_a_retried_step_of_a_recorded_sample_gets_the_same_answer(
    queues: dict[str, str], tokenizer: Any, model: Any
) -> None:
    service = service_for(job_for(queues), tokenizer, model)
    sent: list[str] = []
    send_batch = service.sqs.send_message_batch
    service.sqs.send_message_batch = lambda **kwargs: (
        sent.extend(entry["MessageBody"] for entry in kwargs["Entries"]),
        send_batch(**kwargs),
    )[1]
    generated = []
    generate = service.generator.generate
    service.generator.generate = lambda *a, **k: generated.append(a) or generate(*a, **k)
    service.record(["s"])
    message = {"Body": dump(REQUEST), "ReceiptHandle": "x"}
    service.answer([message])
    service.answer([message])
    assert len(generated) == 1  # sampled once, answered twice with the same tokens
    assert len(sent) == 2 and sent[0] == sent[1]
    assert len(service.recorded(["s"])["s"]) == 1
    # The queue's deduplication id (the step id) keeps the second from being delivered twice.
    assert len(received(queues, QueueKind.GENERATE_RESPONSES)) == 1


def test_a_prompt_with_no_room_left_is_answered_empty_and_cut(
    queues: dict[str, str], tokenizer: Any, model: Any
) -> None:
    prompt_length = len(render_prompt(tokenizer, REQUEST))
    service = service_for(job_for(queues, max_length=prompt_length), tokenizer, model)
    service.answer([{"Body": dump(REQUEST), "ReceiptHandle": "x"}])
    [message] = received(queues, QueueKind.GENERATE_RESPONSES)
    response = parse(GenerateResponse, message["Body"])
    assert response.data.choices[0].message.content == ""
    assert response.finish_reason == "length" and service.counters.over_length == 1


def test_a_generation_asked_to_stop_ends_at_its_next_token(tokenizer: Any, model: Any) -> None:
    """Eight prompts that may each take 4,000 tokens: asked to stop at the fifth check, the
    model runs five more forward passes at most and nothing comes back as an answer."""
    from llm_trainer.generation import GenerationStopped, SamplingSettings

    forwards: list[int] = []
    model.register_forward_hook(lambda *_: forwards.append(1))
    checks: list[int] = []

    def stop() -> bool:
        checks.append(1)
        return len(checks) > 5

    generator = TransformersGenerator(
        model, stop_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
    )
    with pytest.raises(GenerationStopped, match="while generating"):
        generator.generate([[5, 6, 7]] * 8, SamplingSettings(4000), seed=0, stop=stop)
    assert len(forwards) <= 6  # the prompt's pass and one per token until asked
    with pytest.raises(GenerationStopped, match="before generating"):
        generator.generate([[5]], SamplingSettings(4), seed=0, stop=lambda: True)


# A trainer process whose generation service is stopped mid-generation, then exits: its
# generate thread must be gone by then.
_STOPPED_MID_GENERATION = """
import sys, time
import domain.generate_plane as plane
from domain.protocol import GenerateRequest, dump
from llm_trainer.generation import TransformersGenerator
from llm_trainer.service import GenerationService
from llm_trainer.tiny import tiny_model, tiny_tokenizer
from tests.llm_trainer.test_service import job_for

plane.STOP_WAIT_SECONDS = 2  # an interrupted generation ends within a token; 4,000 take longer


class OneRequest:
    def __init__(self):
        self.given = False

    def receive_message(self, **_):
        if self.given:
            return {}
        self.given = True
        request = GenerateRequest(sample_id="s_0", step_id="s_0_1",
                                  messages=[{"role": "user", "content": "Talk."}])
        return {"Messages": [{"Body": dump(request), "ReceiptHandle": "r"}]}

    def send_message_batch(self, **_):
        sys.exit("a stopped generation was answered")


tokenizer = tiny_tokenizer()
# A stop token the model cannot sample: each reply runs to its 4,000 tokens.
generator = TransformersGenerator(tiny_model(tokenizer), stop_token_ids=[len(tokenizer) + 7],
                                  pad_token_id=tokenizer.pad_token_id)
job = job_for(max_new_tokens=4000, max_length=4096)
service = GenerationService(job, sqs=OneRequest(), tokenizer=tokenizer, generator=generator)
service.start()
deadline = time.monotonic() + 60
while not generator.lock.locked():  # a bounded poll: generation has started
    assert time.monotonic() < deadline, "generation never started"
    time.sleep(0.01)
service.stop()
print("stopped mid-generation", flush=True)
"""


def test_a_process_stopped_mid_generation_exits_cleanly() -> None:
    """Before, stopping waited 30 s for the generate thread, then the process exited with it
    still inside torch's generate: "terminate called without an active exception", exit -6
    (a slow baseline evaluation whose rollouts had timed out ended so)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _STOPPED_MID_GENERATION],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "stopped mid-generation"), done.stderr
    assert "terminate called" not in done.stderr
