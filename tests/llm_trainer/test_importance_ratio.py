"""What bounds the importance ratio of the open-weights update (llm_trainer/grpo.py) and the
loss options around it, each against the objective computed by hand token by token: the dual
clip, the log-ratio clamp, masked importance sampling at token and sequence level, clip-higher,
the clip's two sides counted apart, and the three ways tokens' objectives add up."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from domain.grpo import UpdateStats
from llm_trainer.grpo import (
    LossSettings,
    loss_settings,
    mismatch_of,
    scheduled_learning_rate,
    training_sequences,
)
from llm_trainer.logprobs import SamplingDistribution
from llm_trainer.tokens import Segment
from tests.llm_trainer.test_grpo import PROMPT, _token_logprob, sampled_segment, update
from training_configs.schema import load_training_config

TOKENS = [101, 102, 103, 104]


def episode(model: Any, offsets: list[float], temperature: float = 1.0) -> Segment:
    """PROMPT then one sampled token per offset, each sampled with behaviour log-probability
    the model's own less `offset`: its importance ratio is e^offset."""
    built, ids = Segment(), list(PROMPT)
    built.extend(PROMPT)
    for token, offset in zip(TOKENS, offsets, strict=False):
        own = _token_logprob(model, ids, token, temperature)
        built.extend([token], logprobs=[own - offset])
        ids.append(token)
    return built


def weights(model: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_a_token_sampled_ten_nats_less_likely_no_longer_dominates_the_step(model: Any) -> None:
    """The issue's case: A < 0 and a behaviour log-probability 10 nats below the policy's
    (ratio e^10). Unbounded it weighs e^10 times an on-policy token; the dual clip floors its
    objective at c·A; the token band drops it from the objective."""
    built = episode(model, [0.0, 10.0, 0.0])
    sequences = training_sequences([(-1.0, [built])])  # token mean: each token 1/3
    unbounded = update(
        copy.deepcopy(model), sequences, token_band=None, sequence_band=None, dual_clip=None
    )
    assert unbounded.objective == pytest.approx((-1 - math.exp(10) - 1) / 3, rel=1e-4)
    dual = update(copy.deepcopy(model), sequences, token_band=None, sequence_band=None)
    assert dual.objective == pytest.approx((-1 - 3 - 1) / 3, rel=1e-5)
    assert dual.dual_clipped == pytest.approx(1 / 3)
    masked = update(copy.deepcopy(model), sequences, sequence_band=None)
    assert masked.objective == pytest.approx((-1 - 1) / 3, rel=1e-5)
    assert masked.masked_fraction == pytest.approx(1 / 3)
    assert masked.dual_clipped == 0.0  # a masked token is not counted as clipped
    # By default the sequence's geometric-mean ratio, e^(10/3) ≈ 28, is past its band too.
    default = update(copy.deepcopy(model), sequences)
    assert (default.objective, default.masked_fraction) == (0.0, 1.0)


def test_a_dual_clipped_or_masked_token_gets_no_gradient(model: Any) -> None:
    """How far past the bound the ratio is does not change the step: the token's objective is
    a constant there."""
    for bounds in ({"token_band": None, "sequence_band": None}, {}):
        moved = []
        for offset in (5.0, 9.0):  # ratio e^5 or e^9, both past the dual clip and the band
            twin = copy.deepcopy(model)
            built = episode(model, [0.0, 0.0, 0.0, offset])  # geometric mean inside its band
            update(twin, training_sequences([(-1.0, [built])]), **bounds)
            moved.append(weights(twin))
        assert all(torch.equal(moved[0][name], moved[1][name]) for name in moved[0]), bounds
        assert any(not torch.equal(moved[0][n], p) for n, p in model.named_parameters())


def test_the_log_ratio_is_clamped_before_it_overflows(model: Any) -> None:
    """A behaviour log-probability of −1000 (a sampler's −inf written out): without the clamp
    the ratio overflows and the step's objective is not a number; with it, e^20."""
    built = episode(model, [0.0, 1000.0])
    sequences = training_sequences([(-1.0, [built])])
    open_ended = {"token_band": None, "sequence_band": None, "dual_clip": None}
    clamped = update(copy.deepcopy(model), sequences, **open_ended)
    assert clamped.objective == pytest.approx((-1 - math.exp(20)) / 2, rel=1e-4)
    unclamped = update(copy.deepcopy(model), sequences, log_ratio_limit=1e4, **open_ended)
    assert not math.isfinite(unclamped.objective)


def test_a_sequence_whose_geometric_mean_ratio_leaves_its_band_leaves_whole(model: Any) -> None:
    """Every token of the first sequence has ratio e^1.2 ≈ 3.3 (inside the token band), so its
    geometric mean is 3.3 (outside [0.5, 2]): it leaves; the second's ratios e^1.2 and e^−1.2
    average 1: it stays, its tokens clipped as usual (A = 1: min(r, 1.2))."""
    drifted, mixed = episode(model, [1.2, 1.2]), episode(model, [1.2, -1.2])
    sequences = training_sequences([(1.0, [drifted]), (1.0, [mixed])])
    kept_alone = (1.2 + math.exp(-1.2)) / 4
    banded = update(copy.deepcopy(model), sequences, sequence_band=(0.5, 2.0))
    assert banded.objective == pytest.approx(kept_alone, rel=1e-5)
    assert banded.masked_fraction == pytest.approx(2 / 4)
    wide = update(copy.deepcopy(model), sequences)  # (0.1, 10): both stay
    assert wide.objective == pytest.approx(kept_alone + 2 * 1.2 / 4, rel=1e-5)
    assert wide.masked_fraction == 0.0


def test_clip_higher_lets_a_favoured_token_rise_further_than_the_symmetric_clip(
    model: Any,
) -> None:
    """Ratio e^0.22 ≈ 1.246 with A = 1: ε = 0.2 clips it to 1.2; ε_high = 0.28 (DAPO's) keeps
    it, and its gradient."""
    sequences = training_sequences([(1.0, [episode(model, [0.22])])])
    symmetric = update(copy.deepcopy(model), sequences)
    assert symmetric.objective == pytest.approx(1.2, rel=1e-5)
    assert symmetric.clipped_high == 1.0
    higher_model = copy.deepcopy(model)
    higher = update(higher_model, sequences, clip_high=0.28)
    assert higher.objective == pytest.approx(math.exp(0.22), rel=1e-5)
    assert higher.clipped_high == 0.0
    pairs = zip(model.parameters(), higher_model.parameters(), strict=True)
    assert any(not torch.equal(p, q) for p, q in pairs)


def test_the_clip_is_counted_on_each_side(model: Any) -> None:
    """A < 0 with ratio e^−0.4 ≈ 0.67 (below 1 − ε) is clipped low; A > 0 with e^0.4 ≈ 1.49
    clipped high; on-policy tokens are not clipped."""
    falling, rising = episode(model, [-0.4, 0.0]), episode(model, [0.4, 0.0])
    stats = update(model, training_sequences([(-1.0, [falling]), (1.0, [rising])]))
    assert (stats.clipped_low, stats.clipped_high) == (pytest.approx(1 / 4), pytest.approx(1 / 4))
    assert stats.clipped_fraction == pytest.approx(2 / 4)
    # By hand: min(r·A, clip(r)·A) per token, the token mean.
    expected = (-0.8 - 1.0 + 1.2 + 1.0) / 4
    assert stats.objective == pytest.approx(expected, rel=1e-5)


def _lengths(*counts: int) -> list[tuple[float, list[Segment]]]:
    return [(1.0, [sampled_segment(count)]) for count in counts]


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("token", [1 / 5, 1 / 5]),  # every sampled token of the step alike
        ("sequence", [1 / 2, 1 / 8]),  # each episode 1/2, over its own tokens
        ("dr_grpo", [1 / 20, 1 / 20]),  # 1 / (2 episodes × a budget of 10 tokens)
    ],
)
def test_each_aggregation_weighs_tokens_as_its_paper_does(
    aggregation: str, expected: list[float]
) -> None:
    sequences = training_sequences(_lengths(1, 4), aggregation=aggregation, episode_tokens=10)  # type: ignore[arg-type]
    assert [s.weight for s in sequences] == pytest.approx(expected)


def test_dr_grpo_objective_is_the_token_sum_over_a_constant(model: Any) -> None:
    """Dr. GRPO (Liu et al. 2025): Σ over episodes and tokens of the surrogate, divided by the
    episodes × the token budget — a longer episode is not averaged down."""
    short, long = episode(model, [0.0]), episode(model, [0.0, 0.0, 0.0])
    sequences = training_sequences(
        [(1.0, [short]), (-0.5, [long])], aggregation="dr_grpo", episode_tokens=8
    )
    stats = update(model, sequences)
    assert stats.objective == pytest.approx((1.0 - 0.5 * 3) / (2 * 8), rel=1e-5)


def _config(**grpo: Any) -> Any:
    base = load_training_config("rft_multiturn_lora")
    return base.model_validate(
        {**base.model_dump(), "max_steps": 6, "learning_rate": 1e-5, "clip_ratio": 0.2,
         "kl_coefficient": 0.05, "grpo": grpo}
    )  # fmt: skip


def test_the_update_takes_every_setting_from_the_config() -> None:
    grpo = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "dual_clip": 4.0, "log_ratio_limit": 10.0,
            "token_ratio_band": [0.2, 5.0], "sequence_ratio_band": [0.3, 3.0],
            "logprob_chunk_tokens": 256}  # fmt: skip
    config = _config(**grpo).model_copy(update={"clip_ratio": 0.25})  # none of them a default
    assert loss_settings(config) == LossSettings(
        distribution=SamplingDistribution(0.7, 0.9, 50), clip_low=0.25, clip_high=0.25,
        dual_clip=4.0, log_ratio_limit=10.0, token_band=(0.2, 5.0), sequence_band=(0.3, 3.0),
        kl_coefficient=0.05, chunk_tokens=256,
    )  # fmt: skip
    assert loss_settings(_config(sequence_ratio_band=None)).sequence_band is None
    assert loss_settings(_config(clip_ratio_high=0.28)).clip_high == 0.28


def test_the_learning_rate_schedule_by_hand() -> None:
    """Warm-up over 2 of 6 steps, then cosine from the peak over the 4 left."""
    cosine = _config(warmup_steps=2, learning_rate_schedule="cosine")
    expected = [0.5e-5, 1e-5] + [1e-5 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    assert [scheduled_learning_rate(cosine, step) for step in range(1, 7)] == pytest.approx(
        expected
    )
    assert scheduled_learning_rate(cosine, 8) == 0.0  # past the end it stays at the bottom
    constant = _config(warmup_steps=0)
    assert {scheduled_learning_rate(constant, step) for step in range(1, 7)} == {1e-5}


def test_the_mismatch_figures_are_the_ones_an_epoch_keeps() -> None:
    stats = UpdateStats(0.1, 0.0, 0.0, mismatch_kl=0.01, ratio_p1=0.9, ratio_p50=1.0,
                        ratio_p99=1.1, logprob_gap_p50=0.01, logprob_gap_p99=0.1,
                        logprob_gap_max=0.2, grad_norm=3.0)  # fmt: skip
    assert mismatch_of(stats) == {
        "mismatch_kl": 0.01, "ratio_p1": 0.9, "ratio_p50": 1.0, "ratio_p99": 1.1,
        "logprob_gap_p50": 0.01, "logprob_gap_p99": 0.1, "logprob_gap_max": 0.2,
    }  # fmt: skip
    assert set(mismatch_of(None).values()) == {None}
