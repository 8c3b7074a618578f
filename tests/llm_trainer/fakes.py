"""Stand-ins for the open-weights trainer's tests: a generator that samples what it is told
(to pin exact token ids), and a fake SQS in which the reward side plays one-turn episodes
through the trainer's generation service."""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any

from domain.episodes import TRUNCATED_METRIC, TURNS_METRIC
from domain.protocol import (
    GenerateRequest,
    GenerateResponse,
    Metric,
    RolloutRequest,
    RolloutResponse,
    dump,
    parse,
)
from domain.run_queues import QueueKind
from llm_trainer.generation import Sampled, SamplingSettings, Stop, never_stopped

QUEUES = {kind.value: f"https://sqs.local/{kind.value}.fifo" for kind in QueueKind}


class ScriptedGenerator:
    """Answers each prompt with the next scripted token ids (log-probability −1 each), ending
    "stop" when the script ends with a stop token, else "length"."""

    def __init__(self, scripts: Sequence[Sequence[int]], *, stop_token_id: int) -> None:
        self._scripts = deque(list(script) for script in scripts)
        self.stop_token_id = stop_token_id
        self.lock = threading.Lock()
        self.prompts: list[list[int]] = []

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        *,
        seed: int,
        stop: Stop = never_stopped,
    ) -> list[Sampled]:
        answers = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            tokens = self._scripts.popleft()[: settings.max_new_tokens]
            reason = "stop" if tokens and tokens[-1] == self.stop_token_id else "length"
            answers.append(Sampled(tokens, [-1.0] * len(tokens), reason))
        return answers

    def sync(self, model: Any) -> None:
        """Scripted answers come from no weights: nothing to hand over."""


class EpisodeQueues:
    """A fake SQS holding the run's queues. A rollout request becomes a one-turn episode at once:
    its generate request (the record's prompt as the user turn) waits for the trainer's
    generation service; the service's answer is scored by `reward(content)` and comes back as
    the rollout response. Malformed or unknown messages fail the test."""

    def __init__(self, reward: Callable[[str], float]) -> None:
        self.reward = reward
        self._queues: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._handles = itertools.count()
        self._idle = threading.Event()
        self.rollout_requests: list[RolloutRequest] = []
        self.generate_responses: list[GenerateResponse] = []

    def _put(self, kind: QueueKind, body: str) -> None:
        self._queues[QUEUES[kind]].append({"Body": body, "ReceiptHandle": str(next(self._handles))})

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict]) -> dict:  # noqa: N803
        with self._lock:
            for entry in Entries:
                body = entry["MessageBody"]
                if QueueUrl == QUEUES[QueueKind.ROLLOUT_REQUESTS]:
                    request = parse(RolloutRequest, body)
                    self.rollout_requests.append(request)
                    generate = GenerateRequest(
                        sample_id=request.sample_id,
                        step_id=f"{request.sample_id}_0",
                        messages=[{"role": "user", "content": str(request.data["prompt"])}],
                    )
                    self._put(QueueKind.GENERATE_REQUESTS, dump(generate))
                elif QueueUrl == QUEUES[QueueKind.GENERATE_RESPONSES]:
                    response = parse(GenerateResponse, body)
                    self.generate_responses.append(response)
                    choice = response.data.choices[0]
                    rollout = RolloutResponse(
                        sample_id=response.sample_id,
                        stop_reason="end_of_conversation",
                        rewards={"aggregate_score": self.reward(choice.message.content or "")},
                        # As the reward worker counts them (reward_envs/worker/rollout.py).
                        metrics=[
                            Metric(name=TURNS_METRIC, value=1),
                            Metric(
                                name=TRUNCATED_METRIC, value=int(choice.finish_reason == "length")
                            ),
                        ],
                    )
                    self._put(QueueKind.ROLLOUT_RESPONSES, dump(rollout))
                else:
                    raise AssertionError(f"nothing is sent to {QueueUrl}")
        return {"Successful": [{"Id": entry["Id"]} for entry in Entries], "Failed": []}

    def receive_message(self, *, QueueUrl: str, MaxNumberOfMessages: int, **_: Any) -> dict:  # noqa: N803
        with self._lock:
            queue = self._queues[QueueUrl]
            taken = [queue.popleft() for _ in range(min(MaxNumberOfMessages, len(queue)))]
        if not taken:
            self._idle.wait(0.01)  # SQS's long poll of an empty queue, briefly
        return {"Messages": taken} if taken else {}

    def delete_message_batch(self, **_: Any) -> dict:
        return {"Successful": [], "Failed": []}
