"""Sampling completions from the policy, behind one small interface: `TransformersGenerator`
(any Hugging Face causal LM, on a CPU or one GPU: local mode and the tests) here; a vLLM engine
implements the same interface in the trainer image.

A generator takes prompts as token ids and answers sampled token ids with their log-probability
under the distribution it sampled them from (logprobs.py: temperature, top-k, top-p), the one
the update's log-probabilities are of too.

A generation in flight when the job ends is asked to stop (`stop`): it ends at its next token and
raises `GenerationStopped`, so the thread generating ends before the process does. A thread left
inside torch when the interpreter exits aborts the process ("terminate called without an active
exception", exit -6): a slow evaluation whose rollouts had timed out ended that way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from llm_trainer.logprobs import SamplingDistribution, chosen_logprobs, processed_scores

FinishReason = Literal["stop", "length"]
Stop = Callable[[], bool]


def never_stopped() -> bool:
    return False


class GenerationStopped(RuntimeError):
    """The generation was asked to stop before it finished: nothing it sampled is an answer."""


@dataclass(frozen=True)
class Sampled:
    token_ids: list[int]  # ends with the end-of-turn token when finish_reason is "stop"
    logprobs: list[float]
    finish_reason: FinishReason


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no cut

    @property
    def distribution(self) -> SamplingDistribution:
        return SamplingDistribution(self.temperature, self.top_p, self.top_k)


class Generator(Protocol):
    # Held while generating; the trainer holds it while it changes the weights generation uses.
    lock: threading.Lock

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        *,
        seed: int,
        stop: Stop = never_stopped,
    ) -> list[Sampled]:
        """One completion per prompt, sampled reproducibly from `seed`; `GenerationStopped`
        when `stop()` turns true first (checked at least before generating)."""
        ...

    def sync(self, model: Any) -> None:
        """Serve `model`'s weights from now on (the caller times it)."""
        ...


class TransformersGenerator:
    """Samples with the model being trained itself (`model.generate`), so weight sync is
    immediate: generation and updates take turns through `lock`."""

    def __init__(
        self,
        model: Any,
        *,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        autocast: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self.model, self.autocast = model, autocast
        self.stop_token_ids = frozenset(stop_token_ids)
        self.pad_token_id = pad_token_id
        self.lock = threading.Lock()

    def sync(self, model: Any) -> None:
        self.model = model

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        *,
        seed: int,
        stop: Stop = never_stopped,
    ) -> list[Sampled]:
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        class _Asked(StoppingCriteria):
            """Every sequence done once `stop()` is true: checked after each new token."""

            def __call__(self, input_ids: Any, scores: Any, **_: Any) -> Any:
                return torch.full((input_ids.shape[0],), stop(), dtype=torch.bool)

        if not prompts:
            return []
        if stop():
            raise GenerationStopped("asked to stop before generating")
        width = max(len(prompt) for prompt in prompts)
        # Left padding: every prompt ends where generation starts.
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        device = next(self.model.parameters()).device
        with self.lock, torch.no_grad(), self.autocast():
            torch.manual_seed(seed)
            was_training = self.model.training
            self.model.eval()
            output = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                do_sample=True,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                max_new_tokens=settings.max_new_tokens,
                eos_token_id=sorted(self.stop_token_ids),
                pad_token_id=self.pad_token_id,
                synced_gpus=False,  # each process generates on its own requests (sharding.py)
                output_logits=True,
                return_dict_in_generate=True,
                stopping_criteria=StoppingCriteriaList([_Asked()]),
            )
            self.model.train(was_training)
        if stop():
            raise GenerationStopped("asked to stop while generating")
        new = output.sequences[:, width:].cpu()
        # The raw logits of each step (`output_logits`), as the sampler processed them.
        scores = processed_scores(torch.stack(output.logits, dim=1).cpu(), settings.distribution)
        chosen = chosen_logprobs(scores, new)
        return [
            self._completion(new[row].tolist(), chosen[row].tolist()) for row in range(len(prompts))
        ]

    def _completion(self, tokens: list[int], logprobs: list[float]) -> Sampled:
        for end, token in enumerate(tokens):
            if token in self.stop_token_ids:
                return Sampled(tokens[: end + 1], logprobs[: end + 1], "stop")
        return Sampled(tokens, logprobs, "length")
