"""The generation service: answers the run's generate requests with the policy being trained.

It takes up to `generation_batch_size` requests at a time off the generate-request queue, renders
each conversation with the model's chat template, samples the completions together and answers
each in the protocol's v0 shape: the assistant message (with the tool calls the model wrote, in
its chat template's format, when the request offered tools: tool_calls.py), per-token
log-probabilities with tokens named `token_id:<id>` (as vLLM's `return_tokens_as_token_ids`),
the finish reason ("length" when cut at the token limit) and the policy version that produced
it. For the samples being recorded it keeps every turn as tokens (tokens.py), which is what the
update trains on. A malformed request is counted and left on the queue: after the queue's
receive limit it goes to the dead-letter queue, as the router's do.
"""

from __future__ import annotations

import logging
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from domain.generate_plane import GeneratePlane, generate_response
from domain.protocol import (
    GenerateRequest,
    GenerateResponse,
    ProtocolError,
    parse,
    turn_of,
)
from domain.run_queues import QueueKind
from domain.trainer_job import TrainingJob, delete_messages
from llm_trainer.generation import Generator, Sampled, SamplingSettings
from llm_trainer.logprobs import sampling_distribution
from llm_trainer.tokens import SampledTurn
from llm_trainer.tool_calls import assistant_message, reply_text, tool_format_of

log = logging.getLogger("mtrl.trainer")


def token_name(token_id: int) -> str:
    return f"token_id:{token_id}"


def render_prompt(tokenizer: Any, request: GenerateRequest) -> list[int]:
    """The conversation as the model reads it: its chat template, with the generation prompt."""
    messages = [message.model_dump() for message in request.messages]
    text = tokenizer.apply_chat_template(
        messages, tools=request.tools, tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


@dataclass
class ServiceCounters:
    answered: int = 0
    malformed: int = 0
    over_length: int = 0  # prompts that left no room to generate: answered empty, "length"


class GenerationService(GeneratePlane[SampledTurn]):
    def __init__(
        self,
        job: TrainingJob,
        *,
        sqs: Any,
        tokenizer: Any,
        generator: Generator,
        version: int = 0,
    ) -> None:
        super().__init__(job, sqs=sqs, version=version)
        self.tokenizer, self.generator = tokenizer, generator
        self.tool_format = tool_format_of(getattr(tokenizer, "chat_template", None) or "")
        self.settings = SamplingSettings(
            max_new_tokens=job.config.max_new_tokens,
            **asdict(sampling_distribution(job.config)),
        )
        self.batch_size = job.config.grpo.generation_batch_size
        self.counters = ServiceCounters()

    def receive(self) -> list[dict[str, Any]]:
        """Up to a batch of requests: wait for the first, then take what is already there."""
        url = self.job.queues[QueueKind.GENERATE_REQUESTS]
        messages: list[dict[str, Any]] = []
        wait = 1
        while len(messages) < self.batch_size:
            got = self.sqs.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=min(10, self.batch_size - len(messages)),
                WaitTimeSeconds=wait,
            ).get("Messages", [])
            if not got:
                break
            messages += got
            wait = 0
        return messages

    def answer(self, messages: list[dict[str, Any]]) -> None:
        """Answer a batch of queue messages; the well-formed ones are deleted once answered."""
        requests: list[tuple[dict[str, Any], GenerateRequest]] = []
        for message in messages:
            try:
                requests.append((message, parse(GenerateRequest, message["Body"])))
            except ProtocolError as error:
                self.counters.malformed += 1
                log.warning(
                    "leaving a malformed generate request for the dead-letter queue: %s", error
                )
        turns = self._turns_for([request for _, request in requests])
        replies = [
            self._response(request, turn)
            for (_, request), turn in zip(requests, turns, strict=True)
        ]
        self.send(replies)
        self.counters.answered += len(replies)
        if requests:
            queue = self.job.queues[QueueKind.GENERATE_REQUESTS]
            delete_messages(self.sqs, queue, [message for message, _ in requests])

    def _turns_for(self, requests: Sequence[GenerateRequest]) -> list[SampledTurn]:
        """Each request's turn: the one already sampled for a retried step, else a new one."""
        known = [self.kept(r.sample_id, r.step_id) for r in requests]
        version = self.version
        fresh = [i for i, turn in enumerate(known) if turn is None]
        prompts = {i: render_prompt(self.tokenizer, requests[i]) for i in fresh}
        limit = self.job.config.max_length
        by_budget: dict[int, list[int]] = defaultdict(list)  # new-token budget -> requests
        for i in fresh:
            by_budget[min(self.settings.max_new_tokens, limit - len(prompts[i]))].append(i)
        sampled: dict[int, Sampled] = {}
        for budget, indices in by_budget.items():
            if budget < 1:
                self.counters.over_length += len(indices)
                sampled.update({i: Sampled([], [], "length") for i in indices})
                continue
            seed = zlib.crc32(f"{self.job.seed}:{requests[indices[0]].step_id}".encode())
            settings = replace(self.settings, max_new_tokens=budget)
            completions = self.generator.generate(
                [prompts[i] for i in indices], settings, seed=seed, stop=lambda: self.stopped
            )
            sampled.update(zip(indices, completions, strict=True))
        turns = list(known)
        for i in fresh:
            request, completion = requests[i], sampled[i]
            turns[i] = SampledTurn(
                turn=turn_of(request.step_id),
                prompt_ids=tuple(prompts[i]),
                completion_ids=tuple(completion.token_ids),
                logprobs=tuple(completion.logprobs),
                finish_reason=completion.finish_reason,
                policy_version=version,
            )
            self.keep(request.sample_id, request.step_id, turns[i])
        return [turn for turn in turns if turn is not None]

    def _response(self, request: GenerateRequest, turn: SampledTurn) -> GenerateResponse:
        tools_offered = bool(request.tools) and request.tool_choice != "none"
        text = reply_text(
            self.tokenizer, list(turn.completion_ids), tools_offered=tools_offered,
            tool_format=self.tool_format,
        )  # fmt: skip
        return generate_response(
            request,
            message=assistant_message(
                text,
                tools_offered=tools_offered,
                call_id=f"call_{request.step_id}",
                tool_format=self.tool_format,
            ),
            finish_reason=turn.finish_reason,
            tokens=[
                {"token": token_name(token), "logprob": logprob}
                for token, logprob in zip(turn.completion_ids, turn.logprobs, strict=True)
            ],
            version=turn.policy_version,
        )
