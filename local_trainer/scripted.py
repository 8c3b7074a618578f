"""A scripted trainer: the generate side of the rollout protocol with no policy at all.

Each generate request is answered at once with `reply(request)` (the assistant's text, or its
whole message: tool calls included); no logprobs, no learning. The
router's end-to-end test and benchmark use it, so the time they measure is the router's own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from domain.protocol import GenerateRequest, GenerateResponse, dump, fifo_id, parse
from reward_envs.interface import Reply


class ScriptedTrainer(threading.Thread):
    def __init__(
        self,
        sqs: Any,
        *,
        requests_url: str,
        responses_url: str,
        reply: Callable[[GenerateRequest], str | dict[str, Any]],
        wait_seconds: int = 0,
    ) -> None:
        """`wait_seconds`: the long poll; 0 polls briefly and pauses when the queue is empty."""
        super().__init__(name="scripted-trainer", daemon=True)
        self.sqs, self.requests_url, self.responses_url = sqs, requests_url, responses_url
        self.reply, self.wait_seconds = reply, wait_seconds
        self.stop = threading.Event()
        self.answered = 0

    def run(self) -> None:
        while not self.stop.is_set():
            messages = self.sqs.receive_message(
                QueueUrl=self.requests_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=self.wait_seconds,
            ).get("Messages", [])
            if not messages and not self.wait_seconds:
                self.stop.wait(0.01)
            for message in messages:
                request = parse(GenerateRequest, message["Body"])
                reply = Reply.of(self.reply(request)).message
                response = GenerateResponse(
                    sample_id=request.sample_id,
                    step_id=request.step_id,
                    data={
                        "choices": [
                            {
                                "message": reply,
                                "finish_reason": "stop",
                            }
                        ]
                    },
                )
                self.sqs.send_message(
                    QueueUrl=self.responses_url,
                    MessageBody=dump(response),
                    MessageGroupId=fifo_id(request.sample_id),
                    MessageDeduplicationId=fifo_id(request.step_id),
                )
                self.sqs.delete_message(
                    QueueUrl=self.requests_url, ReceiptHandle=message["ReceiptHandle"]
                )
                self.answered += 1
