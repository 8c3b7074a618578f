"""The open-weights update's edges, each against what it must be (found by `make mutate`:
mutants of llm_trainer/grpo.py no test told apart): the band and clip bounds exactly at their
edges, advantages other than ±1, the clamp's lower side in the mismatch figures, an empty
micro-batch, a step with nothing to learn from, the ratio sample past its cap, and what the
reference model is."""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from llm_trainer.grpo import (
    QUANTILE_SAMPLE,
    TALLIED,
    LossSettings,
    Reference,
    _batches,
    _kept,
    _quantiles,
    _sample,
    _Tally,
    _tensors,
    frozen_copy,
    next_token_logprobs,
    training_sequences,
)
from llm_trainer.logprobs import SamplingDistribution
from tests.llm_trainer.test_grpo import PROMPT, _Rank, sampled_segment, update
from tests.llm_trainer.test_importance_ratio import episode
from tests.llm_trainer.test_logprobs import _lora

BANDS = LossSettings(token_band=(0.125, 8.0), sequence_band=(0.1, 10.0))


def test_a_ratio_exactly_on_a_bands_edge_stays_and_unsampled_tokens_never_count() -> None:
    edges = torch.tensor([[0.0, math.log(0.125), math.log(8.0), 0.0]])
    sampled = torch.tensor([[False, True, True, True]])
    assert _kept(edges, sampled, LossSettings(sequence_band=None)).tolist() == [
        [False, True, True, True]  # the first, in the band but not sampled, never counts
    ]
    # A sequence's geometric mean exactly on its band's edges: log(10) over one sampled token.
    for edge in (math.log(10.0), math.log(0.1)):
        one = torch.tensor([[0.0, edge]])
        kept = _kept(one, torch.tensor([[False, True]]), LossSettings(token_band=None))
        assert kept.tolist() == [[False, True]], edge
    # The mean is over the sampled tokens only: 4 and 0 average 2 (inside [0.1, 10] in log
    # space, log 10 ≈ 2.30); over every position it would be 4/3, counting one sampled token
    # alone 4 (outside).
    lone = torch.tensor([[3.0, 0.0, 0.0]])
    assert _kept(lone, torch.tensor([[True, False, False]]), LossSettings(token_band=None)).tolist() == [
        [False, False, False]
    ]  # fmt: skip


def test_advantages_other_than_one_dual_clip_at_c_times_a_and_only_negative(model: Any) -> None:
    """A = −0.5 on a token 10 nats under: floored at 3 × (−0.5); A = 0.5 on one 10 nats over
    (ratio e^-10, under 1 − ε): its surrogate min(rA, clip(r)A) = e^-10 × 0.5, no floor; A = 0:
    nothing counted as clipped or dual-clipped."""
    negative = training_sequences([(-0.5, [episode(model, [10.0])])])
    stats = update(copy.deepcopy(model), negative, token_band=None, sequence_band=None)
    assert stats.objective == pytest.approx(3 * -0.5, rel=1e-5) and stats.dual_clipped == 1.0
    positive = training_sequences([(0.5, [episode(model, [-10.0])])])
    stats = update(copy.deepcopy(model), positive, token_band=None, sequence_band=None)
    assert stats.objective == pytest.approx(math.exp(-10) * 0.5, rel=1e-4)
    assert stats.dual_clipped == 0.0
    flat = training_sequences([(0.0, [episode(model, [10.0, -10.0])])])
    stats = update(copy.deepcopy(model), flat, token_band=None, sequence_band=None)
    assert (stats.clipped_low, stats.clipped_high, stats.dual_clipped) == (0.0, 0.0, 0.0)


def test_the_log_ratio_is_clamped_below_too(model: Any) -> None:
    """Behaviour 30 nats above the policy: the gap the figures keep is the limit's, 20."""
    sequences = training_sequences([(1.0, [episode(model, [-30.0])])])
    stats = update(copy.deepcopy(model), sequences, token_band=None, sequence_band=None)
    assert stats.logprob_gap_max == pytest.approx(20.0, rel=1e-5)
    assert stats.ratio_p1 == pytest.approx(math.exp(-20.0), rel=1e-4)


def test_a_kl_term_without_its_coefficient_counts_nothing(model: Any) -> None:
    sequences = training_sequences([(1.0, [episode(model, [0.0, 0.0])])])
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in moved.parameters():
            parameter.add_(0.01)
    stats = update(moved, sequences, reference=Reference(model, lora=False), kl_coefficient=0.0)
    assert stats.kl == 0.0


def test_an_empty_micro_batch_is_one_unattended_pad_pair_with_nothing_sampled() -> None:
    """What a process with fewer sequences than the others runs (to stay in lockstep): no
    position is masked out entirely (a row of nothing attended would be NaN in softmax)."""
    t = _tensors([], pad_id=7, device=torch.device("cpu"))
    assert t["ids"].tolist() == [[7, 7]] and t["ids"].dtype == torch.long
    assert t["attention"].tolist() == [[1, 1]]
    assert not t["sampled"].any() and t["weight"].tolist() == [[0.0]]


def test_a_step_with_no_sequence_has_no_figures_but_zeros(model: Any) -> None:
    stats = update(copy.deepcopy(model), [])
    assert (stats.objective, stats.clipped_fraction, stats.masked_fraction) == (0.0, 0.0, 0.0)
    assert stats.entropy is None and stats.mismatch_kl is None
    assert stats.ratio_p50 is None and stats.logprob_gap_max is None


def test_ratio_quantiles_of_an_overflowing_log_ratio_warn_of_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ratios = _quantiles(np.array([800.0, 800.0]))
    assert ratios["ratio_p50"] == math.inf


def test_past_the_cap_the_sample_keeps_evenly_spaced_order_statistics() -> None:
    values = torch.arange(3 * QUANTILE_SAMPLE, 0, -1, dtype=torch.float32)  # descending
    sample = _sample(values)
    assert sample.size == QUANTILE_SAMPLE
    assert sample[0] == 1.0 and sample[-1] == 3 * QUANTILE_SAMPLE  # both extremes kept
    assert np.all(np.diff(sample) >= 2.0) and np.all(np.diff(sample) <= 4.0)
    exact = torch.arange(float(QUANTILE_SAMPLE))
    assert np.array_equal(_sample(exact), exact.numpy())  # at the cap: every value


def test_lighter_processes_take_the_next_sequence_by_the_tokens_they_already_have() -> None:
    lengths = [10, 9, 2, 2, 2, 2]
    sequences = [
        training_sequences([(1.0, [sampled_segment(length - 1)])])[0] for length in lengths
    ]
    tokens = [
        sum(len(s.segment.token_ids) for b in _batches(sequences, 8, _Rank(rank, 2)) for s in b)
        for rank in (0, 1)
    ]
    assert tokens == [14, 13]  # 10+2+2 and 9+2+2


def test_dr_grpo_needs_the_episode_budget() -> None:
    with pytest.raises(ValueError) as refused:
        training_sequences([(1.0, [sampled_segment(2)])], aggregation="dr_grpo")
    assert str(refused.value) == (
        "dr_grpo aggregation divides by episode_tokens, an episode's budget"
    )


def test_the_reference_model_does_not_train_and_lora_s_is_its_base(model: Any) -> None:
    frozen = frozen_copy(model)
    assert not any(p.requires_grad for p in frozen.parameters()) and not frozen.training
    ids = torch.tensor([PROMPT + [101, 102]])
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in moved.parameters():
            parameter.add_(0.05)
    # Full fine-tuning: the frozen copy given. LoRA: the model without its adapter, whatever
    # frozen model is passed.
    settings, attention = LossSettings(), torch.ones_like(ids)
    full = Reference(model, lora=False, frozen=moved).logprobs(ids, attention, settings)
    own = next_token_logprobs(moved, ids, attention, SamplingDistribution())
    assert torch.allclose(full, own, atol=1e-6)
    base = next_token_logprobs(model, ids, attention, SamplingDistribution())
    adapted = _lora(copy.deepcopy(model))
    lora = Reference(adapted, lora=True, frozen=moved).logprobs(ids, attention, settings)
    assert torch.allclose(lora, base, atol=1e-6) and not torch.allclose(lora, own, atol=1e-3)


def test_a_steps_counts_stay_exact_past_float32s_integers() -> None:
    """Sums of sampled tokens over a large step: float32 would lose the last one at 2^24."""
    tally = _Tally(torch.device("cpu"))
    tally.add("tokens", torch.tensor(2**24))
    tally.add("tokens", torch.tensor(1))
    assert tally.sums()[TALLIED.index("tokens")] == 2**24 + 1
