"""The GRPO update of a language model, over token-exact sequences (tokens.py).

For each sampled token t of an episode with advantage A: its log-probability now (log π) and when
it was sampled (log μ, the generator's, stale by up to `grpo.max_off_policy_steps` updates and
computed by another engine), both under the sampling distribution (logprobs.py: temperature,
top-k, top-p), and the importance ratio r = exp(clamp(log π − log μ, ±log_ratio_limit)):

  surrogate_t = min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A), and for A < 0 at least c·A,
  objective_t = surrogate_t − β·KL_t,

the clip PPO's with DAPO's clip-higher (ε_high), the floor the dual clip (Ye et al. 2019; verl's
`clip_ratio_c`, 3 by default), the log-ratio clamp verl's (±20), KL_t the k3 estimate
exp(log π_ref − log π) − (log π_ref − log π) − 1 against the reference model (the model without
its adapter for LoRA; the starting weights, frozen, for full fine-tuning). Masked importance
sampling (prime-rl's `token_mask_low/high` 0.125/8 and `geo_mask_low/high` 0.1/10 until its loss
changed in March 2026): a token whose r falls outside the token band, and every token of a
sequence whose geometric-mean r falls outside the sequence band, leave the objective — a
sampler/trainer mismatch or a stale rollout that large is not a sample of this policy.

Tokens the model did not sample (system, user, tool, template) are masked out. How the tokens'
objectives add up (`grpo.loss_aggregation`, weights in `training_sequences`): `token`, the mean
over every sampled token of the step (DAPO; TRL's default); `sequence`, the mean over episodes of
each one's token mean (GRPO's paper); `dr_grpo`, the sum over tokens divided by the episodes
times an episode's token budget (Dr. GRPO, Liu et al. 2025: no length term). The gradient is
accumulated over micro-batches and clipped by its global norm.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from domain.grpo import UpdateStats
from llm_trainer.distributed import ALONE, Collective
from llm_trainer.logprobs import (
    DEFAULT_CHUNK_TOKENS,
    SamplingDistribution,
    TokenScores,
    next_token_scores,
    sampling_distribution,
)
from llm_trainer.sharding import is_sharded
from llm_trainer.tokens import Segment
from training_configs.schema import TrainingConfig

Aggregation = Literal["token", "sequence", "dr_grpo"]
# Values per process behind a step's quantiles (ratios, log-probability gaps): evenly spaced
# order statistics of its own when it has more.
QUANTILE_SAMPLE = 65_536
# UpdateStats' figures of the sampler against the trainer: by name, the quantile of the ratio
# π/μ and of the gap |log π − log μ| over the step's sampled tokens.
RATIO_QUANTILES = {"ratio_p1": 0.01, "ratio_p50": 0.5, "ratio_p99": 0.99}
GAP_QUANTILES = {"logprob_gap_p50": 0.5, "logprob_gap_p99": 0.99, "logprob_gap_max": 1.0}
MISMATCH_FIGURES = ("mismatch_kl", *RATIO_QUANTILES, *GAP_QUANTILES)


@dataclass(frozen=True)
class LossSettings:
    distribution: SamplingDistribution = SamplingDistribution()
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    log_ratio_limit: float = 20.0
    token_band: tuple[float, float] | None = (0.125, 8.0)
    sequence_band: tuple[float, float] | None = (0.1, 10.0)
    kl_coefficient: float = 0.0
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS  # None: the model's whole logits


def loss_settings(config: TrainingConfig) -> LossSettings:
    grpo = config.grpo
    return LossSettings(
        distribution=sampling_distribution(config),
        clip_low=config.clip_ratio,
        clip_high=config.clip_ratio if grpo.clip_ratio_high is None else grpo.clip_ratio_high,
        dual_clip=grpo.dual_clip,
        log_ratio_limit=grpo.log_ratio_limit,
        token_band=grpo.token_ratio_band,
        sequence_band=grpo.sequence_ratio_band,
        kl_coefficient=config.kl_coefficient,
        chunk_tokens=grpo.logprob_chunk_tokens,
    )


@dataclass(frozen=True)
class TrainingSequence:
    segment: Segment
    advantage: float
    weight: float  # of each of its sampled tokens in the batch objective


def training_sequences(
    episodes: Sequence[tuple[float, Sequence[Segment]]],
    *,
    aggregation: Aggregation = "token",
    episode_tokens: int | None = None,
) -> list[TrainingSequence]:
    """(advantage, segments) per episode → sequences whose tokens are weighted as `aggregation`
    says (`episode_tokens`: an episode's token budget, which `dr_grpo` needs). Episodes with no
    sampled token are left out."""
    if aggregation == "dr_grpo" and not episode_tokens:
        raise ValueError("dr_grpo aggregation divides by episode_tokens, an episode's budget")
    counted = [
        (advantage, segments, tokens)
        for advantage, segments in episodes
        if (tokens := sum(segment.sampled_count for segment in segments))
    ]
    total = sum(tokens for _, _, tokens in counted)
    sequences = []
    for advantage, segments, tokens in counted:  # total > 0: each episode sampled a token
        if aggregation == "token":
            weight = 1.0 / total
        elif aggregation == "sequence":
            weight = 1.0 / (tokens * len(counted))
        else:
            weight = 1.0 / (episode_tokens * len(counted))
        sequences += [
            TrainingSequence(segment, advantage, weight)
            for segment in segments
            if segment.sampled_count
        ]
    return sequences


def next_token_logprobs(
    model: Any, ids: Any, attention: Any, distribution: SamplingDistribution
) -> Any:
    """log π(token i+1 | tokens ≤ i) for every position, shape (batch, length − 1)."""
    return next_token_scores(model, ids, attention, distribution).logprobs


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

    def logprobs(self, ids: Any, attention: Any, settings: LossSettings) -> Any:
        """In the caller's autocast: the policy's pass runs in it too, and the KL term compares
        the two (a reference in float32 against a policy in bfloat16 is a KL of rounding)."""
        import torch

        with torch.no_grad(), self._reference() as model:
            return next_token_scores(
                model, ids, attention, settings.distribution, chunk_tokens=settings.chunk_tokens
            ).logprobs

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
    """This process's micro-batches. The sequences are dealt longest first, each to the process
    with the fewest tokens so far, so that no process waits long on another's long sequence;
    each process's go `size` at a time, longest first, so that a micro-batch pads little. Every
    process runs as many micro-batches (the others end with empty ones), since a sharded
    model's forward and backward passes are collectives every process takes part in."""
    shares: list[list[TrainingSequence]] = [[] for _ in range(collective.world_size)]
    tokens = [0] * collective.world_size
    for item in sorted(sequences, key=lambda item: -len(item.segment.token_ids)):
        least = min(range(collective.world_size), key=lambda rank: (tokens[rank], rank))
        shares[least].append(item)
        tokens[least] += len(item.segment.token_ids)
    most = max(math.ceil(len(share) / size) for share in shares)
    mine = shares[collective.rank]
    for start in range(0, most * size, size):
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


TALLIED = ("objective", "kl", "entropy", "mismatch", "tokens", "clipped_low", "clipped_high",
           "dual_clipped", "masked")  # fmt: skip


class _Tally:
    """What a step's micro-batches add up, on one process: float64 tensors where the model is,
    read once when the step ends — reading them at each micro-batch would make the CPU wait for
    its backward pass before it queues the next."""

    def __init__(self, device: Any) -> None:
        import torch

        self._sums = {name: torch.zeros((), dtype=torch.float64, device=device) for name in TALLIED}
        self._log_ratios: list[tuple[Any, Any]] = []

    def add(self, name: str, value: Any) -> None:
        self._sums[name] += value.detach().double()

    def add_log_ratios(self, log_ratios: Any, sampled: Any) -> None:
        self._log_ratios.append((log_ratios.detach(), sampled))

    def sums(self) -> list[float]:
        """The sums, in TALLIED's order."""
        import torch

        return [float(value) for value in torch.stack(list(self._sums.values())).tolist()]

    def log_ratios(self) -> Any:
        """The sampled tokens' log-ratios, on the CPU (read in one go)."""
        import torch

        if not self._log_ratios:
            return torch.zeros(0)
        values = torch.cat([values.flatten() for values, _ in self._log_ratios])
        sampled = torch.cat([sampled.flatten() for _, sampled in self._log_ratios])
        return values[sampled].float().cpu()


def _kept(log_ratio: Any, sampled: Any, settings: LossSettings) -> Any:
    """The sampled tokens whose ratio, and whose sequence's geometric-mean ratio, lie in their
    bands (the rest leave the objective)."""
    import torch

    kept = sampled.clone()
    if settings.token_band is not None:
        low, high = (math.log(bound) for bound in settings.token_band)
        kept &= (log_ratio >= low) & (log_ratio <= high)
    if settings.sequence_band is not None:
        low, high = (math.log(bound) for bound in settings.sequence_band)
        counts = sampled.sum(dim=1).clamp(min=1)
        geometric = torch.where(sampled, log_ratio, 0.0).sum(dim=1) / counts
        kept &= ((geometric >= low) & (geometric <= high)).unsqueeze(1)
    return kept


def _token_objective(
    scores: TokenScores, t: dict[str, Any], settings: LossSettings, tally: _Tally
) -> tuple[Any, Any]:
    """Each token's surrogate, and which tokens count; the batch's figures into `tally`."""
    import torch

    advantage, sampled = t["advantage"], t["sampled"]
    limit = settings.log_ratio_limit
    log_ratio = (scores.logprobs - t["behaviour"]).clamp(-limit, limit)
    ratio = torch.exp(log_ratio)
    bounded = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    surrogate = torch.minimum(ratio * advantage, bounded * advantage)
    negative = advantage < 0
    detached = log_ratio.detach()
    kept = _kept(detached, sampled, settings)
    if settings.dual_clip is not None:
        floor = settings.dual_clip * advantage
        surrogate = torch.where(negative, torch.maximum(surrogate, floor), surrogate)
        tally.add("dual_clipped", (kept & negative & (ratio > settings.dual_clip)).sum())
    tally.add("tokens", sampled.sum())
    tally.add("masked", (sampled & ~kept).sum())
    tally.add("clipped_low", (kept & negative & (ratio < 1.0 - settings.clip_low)).sum())
    tally.add("clipped_high", (kept & (advantage > 0) & (ratio > 1.0 + settings.clip_high)).sum())
    # The sampler/trainer mismatch, k3 of KL(μ‖π) over the sampled tokens (as prime-rl's).
    tally.add("mismatch", _masked_sum(torch.expm1(detached) - detached, sampled))
    tally.add_log_ratios(detached, sampled)
    if scores.entropy is not None:
        tally.add("entropy", _masked_sum(scores.entropy, sampled))
    return surrogate, kept


def _masked_sum(values: Any, mask: Any) -> Any:
    """The sum of `values` where `mask` is set; unlike `values[mask]`, whose size the CPU must
    read from the device, it waits for nothing."""
    import torch

    return torch.where(mask, values, 0.0).sum()


def grpo_update(
    model: Any,
    optimizer: Any,
    sequences: Sequence[TrainingSequence],
    *,
    pad_id: int,
    settings: LossSettings,
    micro_batch_size: int,
    max_grad_norm: float,
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
    tally = _Tally(device)
    for batch in _batches(sequences, micro_batch_size, collective):
        t = _tensors(batch, pad_id, device)
        with autocast():
            scores = next_token_scores(
                model, t["ids"], t["attention"], settings.distribution, entropy=True,
                chunk_tokens=settings.chunk_tokens,
            )  # fmt: skip
            surrogate, kept = _token_objective(scores, t, settings, tally)
            per_token = surrogate
            if settings.kl_coefficient and reference is not None:
                delta = reference.logprobs(t["ids"], t["attention"], settings) - scores.logprobs
                kl = torch.expm1(delta) - delta  # e^δ − δ − 1 without float32's cancellation
                per_token = surrogate - settings.kl_coefficient * kl
                tally.add("kl", _masked_sum(kl * t["weight"], kept))
        batch_objective = _masked_sum(per_token * t["weight"], kept)
        (-batch_objective).backward()
        tally.add("objective", batch_objective)
    trained = [p for p in model.parameters() if p.requires_grad]
    if not is_sharded(model):  # a sharded model's backward passes summed them already
        collective.sum_gradients(trained)
    norm = torch.nn.utils.clip_grad_norm_(trained, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return _stats(tally, collective, grad_norm=_value(norm))


def _value(tensor: Any) -> float:
    """A scalar tensor's value (a sharded one's whole)."""
    return float(tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor)


def _stats(tally: _Tally, collective: Collective, *, grad_norm: float) -> UpdateStats:
    (objective, kl, entropy, mismatch, tokens, low, high, dual, masked) = collective.sum(
        tally.sums()
    )
    log_ratios = np.concatenate(collective.gather(_sample(tally.log_ratios())))
    share = (lambda count: count / tokens) if tokens else (lambda count: 0.0)
    return UpdateStats(
        objective=objective,
        kl=kl,
        clipped_fraction=share(low + high),
        clipped_low=share(low),
        clipped_high=share(high),
        dual_clipped=share(dual),
        masked_fraction=share(masked),
        grad_norm=grad_norm,
        entropy=entropy / tokens if tokens else None,
        mismatch_kl=mismatch / tokens if tokens else None,
        **_quantiles(log_ratios),
    )


def _quantiles(log_ratios: Any) -> dict[str, float | None]:
    """The ratio's quantiles (exp after the quantile, which it keeps: an unclamped log-ratio's
    exp may overflow) and the gap |log π − log μ|'s; None for each without a token."""
    if not log_ratios.size:
        return dict.fromkeys((*RATIO_QUANTILES, *GAP_QUANTILES))
    gaps = np.abs(log_ratios)
    with np.errstate(over="ignore"):
        ratios = {name: float(np.exp(np.quantile(log_ratios, q))) for name, q in RATIO_QUANTILES.items()}  # fmt: skip
    return ratios | {name: float(np.quantile(gaps, q)) for name, q in GAP_QUANTILES.items()}


def _sample(log_ratios: Any) -> Any:
    """This process's log-ratios, or QUANTILE_SAMPLE evenly spaced order statistics of them."""
    values = np.sort(log_ratios.numpy())
    if values.size <= QUANTILE_SAMPLE:
        return values
    return values[np.linspace(0, values.size - 1, QUANTILE_SAMPLE).round().astype(int)]


def mismatch_of(stats: UpdateStats | None) -> dict[str, float | None]:
    return {name: getattr(stats, name, None) for name in MISMATCH_FIGURES}


def scheduled_learning_rate(config: TrainingConfig, step: int) -> float:
    """The learning rate of the run's `step` (from 1): a linear warm-up over
    `grpo.warmup_steps`, then constant or a cosine decay that would reach zero a step after
    `max_steps`."""
    grpo, peak = config.grpo, config.learning_rate
    if step <= grpo.warmup_steps:
        return peak * step / grpo.warmup_steps
    if grpo.learning_rate_schedule == "constant":
        return peak
    progress = (step - grpo.warmup_steps - 1) / (config.max_steps - grpo.warmup_steps)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
