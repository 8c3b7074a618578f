"""The GRPO update of a language model, over token-exact sequences (tokens.py).

For each sampled token t of an episode with advantage A, its log-probability now (log π) and
when it was sampled (log π_old, from generation), r = exp(log π − log π_old):
  objective_t = min(r·A, clip(r, 1−ε, 1+ε)·A) − β·KL_t,
KL_t the k3 estimate exp(log π_ref − log π) − (log π_ref − log π) − 1 against the reference
model (the model without its adapter for LoRA; a frozen copy for full fine-tuning). Tokens the
model did not sample (system, user, tool, template) are masked out. The batch objective is the
mean over episodes of the mean over each episode's sampled tokens, so an episode weighs the same
however long it is; the gradient is accumulated over micro-batches and clipped.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from domain.grpo import UpdateStats
from llm_trainer.distributed import ALONE, Collective
from llm_trainer.sharding import is_sharded
from llm_trainer.tokens import Segment


@dataclass(frozen=True)
class TrainingSequence:
    segment: Segment
    advantage: float
    weight: float  # of each of its sampled tokens in the batch objective


def training_sequences(
    episodes: Sequence[tuple[float, Sequence[Segment]]],
) -> list[TrainingSequence]:
    """(advantage, segments) per episode → sequences weighted so that episodes count equally.
    Episodes with no sampled token are left out."""
    counted = [
        (advantage, segments)
        for advantage, segments in episodes
        if sum(segment.sampled_count for segment in segments)
    ]
    sequences = []
    for advantage, segments in counted:
        tokens = sum(segment.sampled_count for segment in segments)
        weight = 1.0 / (tokens * len(counted))
        sequences += [
            TrainingSequence(segment, advantage, weight)
            for segment in segments
            if segment.sampled_count
        ]
    return sequences


def next_token_logprobs(model: Any, ids: Any, attention: Any, temperature: float) -> Any:
    """log π(token i+1 | tokens ≤ i) for every position, shape (batch, length − 1)."""
    import torch

    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def frozen_copy(model: Any) -> Any:
    """A copy of `model` as it is now that does not train: full fine-tuning's reference."""
    return copy.deepcopy(model).eval().requires_grad_(False)


class Reference:
    """Log-probabilities under the reference model (what the KL term pulls towards)."""

    def __init__(self, model: Any, *, lora: bool, frozen: Any = None) -> None:
        """LoRA: the base model is the reference (the adapter switched off); full: `frozen`, a
        copy of the model as training started (made here when not given)."""
        if not lora and frozen is None:
            frozen = frozen_copy(model)
        self._frozen, self._model = (None if lora else frozen), model

    def logprobs(self, ids: Any, attention: Any, temperature: float) -> Any:
        import torch

        with torch.no_grad(), self._reference() as model:
            return next_token_logprobs(model, ids, attention, temperature)

    @contextlib.contextmanager
    def _reference(self) -> Iterator[Any]:
        if self._frozen is not None:
            yield self._frozen
        else:
            with self._model.disable_adapter():
                yield self._model


def _batches(
    sequences: Sequence[TrainingSequence], size: int, collective: Collective
) -> Iterator[Sequence[TrainingSequence]]:
    """This process's micro-batches: every world_size-th sequence, `size` at a time, and as many
    batches on every process — the first has the most; the others end with empty ones — since a
    sharded model's forward and backward passes are collectives every process takes part in."""
    mine = sequences[collective.rank :: collective.world_size]
    most = len(sequences[:: collective.world_size])
    for start in range(0, most, size):
        yield mine[start : start + size]


def _tensors(batch: Sequence[TrainingSequence], pad_id: int, device: Any) -> dict[str, Any]:
    """Right-padded ids, attention, and per next-token: sampled mask, behaviour log-probability,
    advantage and weight. An empty batch is one pad token twice with nothing sampled: a pass
    that changes no gradient."""
    import torch

    width = max((len(item.segment.token_ids) for item in batch), default=2)
    shape = (max(len(batch), 1), width)
    ids = torch.full(shape, pad_id, dtype=torch.long)
    attention = torch.full(shape, 0 if batch else 1, dtype=torch.long)
    sampled = torch.zeros(shape, dtype=torch.bool)
    behaviour = torch.zeros(shape, dtype=torch.float32)
    advantage = torch.zeros(shape, dtype=torch.float32)
    weight = torch.zeros(shape, dtype=torch.float32)
    for row, item in enumerate(batch):
        n = len(item.segment.token_ids)
        ids[row, :n] = torch.tensor(item.segment.token_ids)
        attention[row, :n] = 1
        sampled[row, :n] = torch.tensor(item.segment.sampled)
        behaviour[row, :n] = torch.tensor(item.segment.behaviour_logprobs)
        advantage[row, :n] = item.advantage
        weight[row, :n] = item.weight
    # Token i+1 is predicted at position i: the per-token values shift by one.
    tensors = {
        "ids": ids,
        "attention": attention,
        "sampled": sampled[:, 1:],
        "behaviour": behaviour[:, 1:],
        "advantage": advantage[:, 1:],
        "weight": weight[:, 1:],
    }
    return {name: tensor.to(device) for name, tensor in tensors.items()}


def grpo_update(
    model: Any,
    optimizer: Any,
    sequences: Sequence[TrainingSequence],
    *,
    pad_id: int,
    clip_ratio: float,
    temperature: float,
    micro_batch_size: int,
    max_grad_norm: float,
    kl_coefficient: float = 0.0,
    reference: Reference | None = None,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    collective: Collective = ALONE,
) -> UpdateStats:
    """One optimizer step over `sequences`; the objective it maximised and what happened. With
    several processes (`collective`), each takes every world_size-th sequence and the gradients
    are summed: the sequences' weights are shares of the whole step, so the sum is the step's
    gradient, and every process takes the same optimizer step."""
    import torch

    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    objective, kl_total, clipped, tokens = 0.0, 0.0, 0, 0
    for batch in _batches(sequences, micro_batch_size, collective):
        t = _tensors(batch, pad_id, device)
        with autocast():
            logprobs = next_token_logprobs(model, t["ids"], t["attention"], temperature)
        ratio = torch.exp(logprobs - t["behaviour"])
        bounded = ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio)
        surrogate = torch.minimum(ratio * t["advantage"], bounded * t["advantage"])
        per_token = surrogate
        if kl_coefficient and reference is not None:
            delta = reference.logprobs(t["ids"], t["attention"], temperature) - logprobs
            kl = torch.exp(delta) - delta - 1.0
            per_token = surrogate - kl_coefficient * kl
            kl_total += float((kl * t["weight"])[t["sampled"]].sum().detach())
        mask = t["sampled"]
        batch_objective = (per_token * t["weight"])[mask].sum()
        (-batch_objective).backward()
        objective += float(batch_objective.detach())
        is_clipped = (bounded * t["advantage"] < ratio * t["advantage"]) & mask
        clipped += int(is_clipped.sum())
        tokens += int(mask.sum())
    trained = [p for p in model.parameters() if p.requires_grad]
    if not is_sharded(model):  # a sharded model's backward passes summed them already
        collective.sum_gradients(trained)
    objective, kl_total, clipped, tokens = collective.sum([objective, kl_total, clipped, tokens])
    torch.nn.utils.clip_grad_norm_(trained, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateStats(
        objective=objective, kl=kl_total, clipped_fraction=clipped / tokens if tokens else 0.0
    )
