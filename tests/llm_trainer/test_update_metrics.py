"""The figures an open-weights update reports each step (llm_trainer/grpo.py, metrics.jsonl):
the sampler/trainer mismatch, the ratio's quantiles, the gradient's norm before clipping, the
policy's entropy, each computed by hand here; and the KL term's reference under the policy's
own autocast."""

from __future__ import annotations

import copy
import math
from dataclasses import asdict
from typing import Any

import numpy as np
import pytest
import torch

from domain.grpo import StepMetrics, UpdateStats, score_groups
from llm_trainer.grpo import Reference, frozen_copy, training_sequences
from llm_trainer.logprobs import SamplingDistribution, next_token_scores
from tests.llm_trainer.test_grpo import PROMPT, update
from tests.llm_trainer.test_importance_ratio import TOKENS, episode

OFFSETS = [0.3, -0.2, 0.05, 1.1]  # log π − log μ of each sampled token


def test_the_mismatch_figures_are_those_of_the_sampled_tokens_log_ratios(model: Any) -> None:
    stats = update(model, training_sequences([(1.0, [episode(model, OFFSETS)])]))
    k3 = [math.exp(o) - o - 1 for o in OFFSETS]  # estimates KL(μ‖π) from μ's samples
    assert stats.mismatch_kl == pytest.approx(sum(k3) / 4, rel=1e-4)
    ratios = np.exp(OFFSETS)
    assert stats.ratio_p50 == pytest.approx(float(np.exp(np.quantile(OFFSETS, 0.5))), rel=1e-4)
    assert stats.ratio_p1 == pytest.approx(float(np.exp(np.quantile(OFFSETS, 0.01))), rel=1e-4)
    assert stats.ratio_p99 == pytest.approx(float(np.exp(np.quantile(OFFSETS, 0.99))), rel=1e-4)
    assert stats.ratio_p1 >= ratios.min() and stats.ratio_p99 <= ratios.max()
    gaps = np.abs(OFFSETS)
    assert stats.logprob_gap_max == pytest.approx(1.1, rel=1e-4)
    assert stats.logprob_gap_p50 == pytest.approx(float(np.quantile(gaps, 0.5)), rel=1e-4)
    assert stats.logprob_gap_p99 == pytest.approx(float(np.quantile(gaps, 0.99)), rel=1e-4)


def test_the_gradient_norm_is_the_one_before_clipping_computed_by_hand(model: Any) -> None:
    """The objective's gradient by autograd on a path of its own (on-policy: the surrogate's
    gradient is A·∇log π per token, the token mean), against what the update reports while it
    clips to a far smaller norm."""
    built = episode(model, [0.0, 0.0, 0.0])
    twin = copy.deepcopy(model)
    ids = torch.tensor([built.token_ids])
    logprobs = next_token_scores(twin, ids, torch.ones_like(ids), SamplingDistribution()).logprobs
    sampled = torch.tensor(built.sampled[1:])
    (-(logprobs[0][sampled]).mean()).backward()  # A = 1
    by_hand = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in twin.parameters()))
    stats = update(model, training_sequences([(1.0, [built])]), max_grad_norm=1e-4)
    assert by_hand > 1e-3
    assert stats.grad_norm == pytest.approx(by_hand, rel=1e-4)


def test_the_entropy_is_the_sampling_distributions_at_each_sampled_token(model: Any) -> None:
    temperature = 0.7
    built = episode(model, [0.0, 0.0], temperature=temperature)
    expected, ids = [], list(PROMPT)
    for token in TOKENS[:2]:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double() / temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        expected.append(float(-(logprobs.exp() * logprobs).sum()))
        ids.append(token)
    stats = update(model, training_sequences([(1.0, [built])]), temperature=temperature)
    assert stats.entropy == pytest.approx(sum(expected) / 2, rel=1e-4)


def test_the_reference_runs_in_the_policys_autocast(model: Any) -> None:
    """At equal weights the KL term is 0 when both passes run in bfloat16; a reference left in
    float32 against a bfloat16 policy measures rounding as KL."""
    built = episode(model, [0.0, 0.0, 0.0])
    sequences = training_sequences([(1.0, [built])])

    def bfloat16() -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    stats = update(
        model, sequences, kl_coefficient=0.5, reference=Reference(model, lora=False),
        autocast=bfloat16,
    )  # fmt: skip
    assert stats.kl == 0.0


def test_a_step_without_an_update_writes_every_update_figure_as_none() -> None:
    """metrics.jsonl's lines have the same keys whether the step learned or not."""
    _, rollouts = score_groups({}, {})
    learned = StepMetrics(1, rollouts, UpdateStats(0.1, 0.0, 0.0), 1.0, 0.0, 1.0).line()
    idle = StepMetrics(2, rollouts, None, 1.0, 0.0, 1.0).line()
    assert learned.keys() == idle.keys()
    assert {"grad_norm", "mismatch_kl", "entropy", "clipped_high"} <= idle.keys()
    assert idle["grad_norm"] is None


def test_the_steps_figures_do_not_depend_on_its_micro_batches(model: Any) -> None:
    """Three episodes (clipped, dual-clipped, masked and on-policy tokens among them, a KL term
    after a move) in one micro-batch or one sequence at a time: every figure the same — each is
    summed over the micro-batches, not the last one's."""
    frozen = frozen_copy(model)
    episodes = [
        (1.0, [episode(model, [0.4, 0.0, -0.1])]),
        (-1.0, [episode(model, [-0.4, 1.5, 0.0, 0.2])]),
        (-0.5, [episode(model, [3.0, 0.0])]),  # 3 > log 8: masked
    ]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter, generator=torch.Generator().manual_seed(1)))  # fmt: skip
    figures = []
    for size in (8, 1):
        stats = update(
            copy.deepcopy(model), training_sequences(episodes), micro_batch_size=size,
            kl_coefficient=0.3, reference=Reference(model, lora=False, frozen=frozen),
        )  # fmt: skip
        figures.append(asdict(stats))
    one, each = figures
    assert one["masked_fraction"] > 0 and one["clipped_low"] > 0 and one["clipped_high"] > 0
    assert one["dual_clipped"] > 0 and one["kl"] > 0
    for name, value in one.items():
        assert each[name] == pytest.approx(value, rel=1e-5, abs=1e-9), name
