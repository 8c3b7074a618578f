"""The open-weights GRPO update: group-relative advantages, episodes weighed equally, the loss
over sampled tokens only, clipping, the KL term — and that one update moves the model towards
the completion with the higher advantage."""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from domain.grpo import group_advantages
from llm_trainer.grpo import (
    LossSettings,
    Reference,
    _batches,
    frozen_copy,
    grpo_update,
    next_token_logprobs,
    training_sequences,
)
from llm_trainer.logprobs import SamplingDistribution
from llm_trainer.tokens import Segment

PROMPT = [264, 84, 82, 257, 198]  # any tokens of the tiny vocabulary
AS_SAMPLED = SamplingDistribution()  # T = 1, no cut


def completion_logprob(model: Any, prompt: list[int], completion: list[int]) -> float:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logprobs = next_token_logprobs(model, ids, torch.ones_like(ids), AS_SAMPLED)[0]
    return float(logprobs[len(prompt) - 1 :].sum())


def segment(model: Any, prompt: list[int], completion: list[int]) -> Segment:
    """The sequence as generation would have produced it: behaviour log-probabilities are the
    model's own now (an on-policy update)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logprobs = next_token_logprobs(model, ids, torch.ones_like(ids), AS_SAMPLED)[0]
    built = Segment()
    built.extend(prompt)
    built.extend(completion, logprobs=logprobs[len(prompt) - 1 :].tolist())
    return built


def loss(*, temperature: float = 1.0, clip_ratio: float = 0.2, **others: Any) -> LossSettings:
    """The update's settings: `temperature` that of the sampling distribution, `clip_ratio`
    both sides of the clip unless `clip_high` says otherwise."""
    distribution = SamplingDistribution(
        temperature, others.pop("top_p", 1.0), others.pop("top_k", 0)
    )
    return LossSettings(
        distribution=distribution, clip_low=clip_ratio,
        clip_high=others.pop("clip_high", clip_ratio), **others,
    )  # fmt: skip


def sampled_segment(count: int) -> Segment:
    """One prompt token, then `count` sampled ones."""
    built = Segment()
    built.extend([1])
    built.extend([2] * count, logprobs=[-1.0] * count)
    return built


def update(
    model: Any,
    sequences: Any,
    *,
    lr: float = 1e-2,
    reference: Any = None,
    max_grad_norm: float = 1.0,
    autocast: Any = contextlib.nullcontext,
    micro_batch_size: int = 2,
    **settings: Any,
) -> Any:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0)
    return grpo_update(
        model, optimizer, sequences, pad_id=0, settings=loss(**settings),
        micro_batch_size=micro_batch_size, max_grad_norm=max_grad_norm, reference=reference,
        autocast=autocast,
    )  # fmt: skip


def test_advantages_are_relative_to_the_group_and_normalised_as_configured() -> None:
    rewards = [0.0, 1.0, 1.0, 0.0]
    assert group_advantages(rewards).tolist() == pytest.approx([-1, 1, 1, -1], abs=1e-5)
    assert group_advantages(rewards, normalization="mean").tolist() == [-0.5, 0.5, 0.5, -0.5]
    assert not group_advantages([0.3, 0.3, 0.3], normalization="mean").any()


def test_sequence_aggregation_weighs_episodes_the_same_whatever_their_length() -> None:
    short, long = Segment(), Segment()
    short.extend([1]), short.extend([2], logprobs=[-1.0])
    long.extend([1]), long.extend([2, 3, 4, 5], logprobs=[-1.0] * 4)
    empty = Segment()
    empty.extend([1, 2])  # nothing sampled: nothing to learn from
    sequences = training_sequences(
        [(1.0, [short]), (-1.0, [long]), (0.5, [empty])], aggregation="sequence"
    )
    assert [s.advantage for s in sequences] == [1.0, -1.0]
    per_episode = [s.weight * s.segment.sampled_count for s in sequences]
    assert per_episode == pytest.approx([0.5, 0.5])


def test_one_update_raises_the_high_advantage_completion_and_lowers_the_other(model: Any) -> None:
    good, bad = [101, 102, 103], [110, 111, 112]
    before = completion_logprob(model, PROMPT, good), completion_logprob(model, PROMPT, bad)
    advantages = group_advantages([1.0, 0.0])
    sequences = training_sequences(
        [
            (advantages[0], [segment(model, PROMPT, good)]),
            (advantages[1], [segment(model, PROMPT, bad)]),
        ]
    )
    stats = update(model, sequences)
    after = completion_logprob(model, PROMPT, good), completion_logprob(model, PROMPT, bad)
    assert after[0] > before[0] and after[1] < before[1]
    assert stats.clipped_fraction == 0.0  # on-policy: every ratio starts at 1


def _token_logprob(model: Any, prefix: list[int], token: int, temperature: float) -> float:
    """log π(token | prefix) at `temperature`, from the model's last position on the prefix
    alone: a path of its own (no batch, no padding, no shift)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prefix])).logits[0, -1].double() / temperature
    return float(torch.log_softmax(logits, dim=-1)[token])


def test_the_objective_is_the_clipped_surrogate_computed_by_hand_at_the_sampling_temperature(
    model: Any,
) -> None:
    """Two episodes (one of two turns, a tool's reply between them that the model did not
    sample), behaviour log-probabilities off the model's own so that some ratios leave the
    band, T = 0.7: the update's objective and clipped fraction are what the formula gives, token
    by token — the log-probabilities at the sampling temperature, of the sampled tokens only,
    each episode weighing 1/2 spread over its tokens. A mask shifted by one token or a
    temperature ignored changes them (both passed every other test here)."""
    temperature, clip = 0.7, 0.2
    # (token, sampled?, behaviour log-probability offset from the model's own)
    first = [(101, True, 0.0), (102, True, -0.5), (120, False, 0.0), (121, False, 0.0),
             (103, True, 0.3), (104, True, -0.05)]  # fmt: skip
    second = [(110, True, 0.4), (111, True, -0.1)]
    episodes, expected, clipped, sampled = [], 0.0, 0, 0
    for advantage, tokens in ((1.0, first), (-1.0, second)):
        built, ids = Segment(), list(PROMPT)
        built.extend(PROMPT)
        terms = []
        for token, was_sampled, offset in tokens:
            if was_sampled:
                own = _token_logprob(model, ids, token, temperature)
                behaviour = own + offset
                built.extend([token], logprobs=[behaviour])
                ratio = torch.exp(torch.tensor(own - behaviour, dtype=torch.float64))
                bounded = ratio.clamp(1 - clip, 1 + clip)
                terms.append(float(torch.minimum(ratio * advantage, bounded * advantage)))
                clipped += bool(bounded * advantage < ratio * advantage)
                sampled += 1
            else:
                built.extend([token])
            ids.append(token)
        expected += sum(terms) / (len(terms) * 2)  # each episode weighs 1/2 over its tokens
        episodes.append((advantage, [built]))
    assert 0 < clipped < sampled  # the case covers both sides of the band
    sequences = training_sequences(episodes, aggregation="sequence")
    stats = update(model, sequences, temperature=temperature, clip_ratio=clip)
    assert stats.objective == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert stats.clipped_fraction == pytest.approx(clipped / sampled)


def test_the_loss_ignores_every_token_the_model_did_not_sample(model: Any) -> None:
    """The same update whatever the masked tokens' bookkeeping says: two batches that differ
    only in the behaviour log-probabilities of prompt tokens move the weights identically."""
    twin = copy.deepcopy(model)
    built = segment(model, PROMPT, [101, 102])
    tampered = copy.deepcopy(built)
    tampered.behaviour_logprobs[: len(PROMPT)] = [-50.0] * len(PROMPT)
    update(model, training_sequences([(1.0, [built])]))
    update(twin, training_sequences([(1.0, [tampered])]))
    for (name, mine), (_, theirs) in zip(
        model.named_parameters(), twin.named_parameters(), strict=True
    ):
        assert torch.equal(mine, theirs), name


def test_a_ratio_past_the_clip_in_the_favoured_direction_gets_no_gradient(model: Any) -> None:
    built = segment(model, PROMPT, [101, 102])
    # Sampled when the tokens were far less likely: the ratio is far above 1 + ε.
    built.behaviour_logprobs = [
        lp - 5.0 if s else lp for lp, s in zip(built.behaviour_logprobs, built.sampled, strict=True)
    ]
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    stats = update(model, training_sequences([(1.0, [built])]), token_band=None, sequence_band=None)
    assert stats.clipped_fraction == stats.clipped_high == 1.0
    assert all(torch.equal(before[name], p) for name, p in model.named_parameters())


def test_the_kl_term_is_zero_at_the_reference_and_is_subtracted_after_a_move(model: Any) -> None:
    reference = Reference(model, lora=False)
    built = segment(model, PROMPT, [101, 102])
    stats = update(
        model, training_sequences([(1.0, [built])]), kl_coefficient=0.5, reference=reference
    )
    assert stats.kl == pytest.approx(0.0, abs=1e-9)
    # The model has moved away from the reference: the same batch, with and without the term.
    moved = training_sequences([(1.0, [segment(model, PROMPT, [101, 102])])])
    with_kl = update(copy.deepcopy(model), moved, kl_coefficient=0.5, reference=reference)
    without = update(copy.deepcopy(model), moved)
    assert with_kl.kl > 0
    assert with_kl.objective == pytest.approx(without.objective - 0.5 * with_kl.kl, rel=1e-5)


def test_the_kl_term_is_the_k3_estimate_against_the_reference_computed_by_hand(
    model: Any,
) -> None:
    """After the model moved from its reference, the update's KL is Σ w·(e^(ref−π) − (ref−π) −
    1) over the sampled tokens, at the sampling temperature, and the objective the surrogate
    less β times it: an estimate taken the other way round (e^(π−ref) − (π−ref) − 1) differs."""
    temperature, beta, completion = 0.8, 0.3, [101, 102, 103]
    frozen = frozen_copy(model)
    reference = Reference(model, lora=False, frozen=frozen)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(
                0.05 * torch.randn_like(parameter, generator=torch.Generator().manual_seed(7))
            )
    built, ids, kl, surrogate = Segment(), list(PROMPT), 0.0, 0.0
    built.extend(PROMPT)
    for token in completion:
        own = _token_logprob(model, ids, token, temperature)
        ref = _token_logprob(frozen, ids, token, temperature)
        built.extend([token], logprobs=[own])  # on-policy: every ratio 1, the surrogate A
        kl += (math.exp(ref - own) - (ref - own) - 1) / len(completion)
        surrogate += 1.0 / len(completion)
        ids.append(token)
    stats = update(
        model, training_sequences([(1.0, [built])]), temperature=temperature,
        kl_coefficient=beta, reference=reference,
    )  # fmt: skip
    assert kl > 1e-4
    assert stats.kl == pytest.approx(kl, rel=1e-4)
    assert stats.objective == pytest.approx(surrogate - beta * kl, rel=1e-4)


def test_a_lora_model_is_its_own_reference_without_the_adapter(model: Any) -> None:
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(model)
    adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.05)  # the adapter now changes the outputs
    ids = torch.tensor([PROMPT + [101, 102]])
    attention = torch.ones_like(ids)
    expected = next_token_logprobs(base, ids, attention, AS_SAMPLED)
    assert not torch.allclose(next_token_logprobs(adapted, ids, attention, AS_SAMPLED), expected)
    reference = Reference(adapted, lora=True)
    assert torch.allclose(reference.logprobs(ids, attention, loss()), expected, atol=1e-6)


@dataclass(frozen=True)
class _Rank:
    rank: int
    world_size: int


def test_processes_get_as_many_tokens_as_can_be_and_micro_batches_of_like_lengths() -> None:
    """One 100-token sequence and nine of 10 over two processes: round-robin would give one
    process 140 tokens and the other 50; dealt longest first to the lighter, 100 and 90. Each
    process's micro-batches are longest first, and both run as many of them."""
    lengths = [10, 100, 10, 10, 10, 10, 10, 10, 10, 10]
    sequences = [
        training_sequences([(1.0, [sampled_segment(length - 1)])])[0] for length in lengths
    ]
    batches = [list(_batches(sequences, 4, _Rank(rank, 2))) for rank in (0, 1)]
    tokens = [sum(len(s.segment.token_ids) for b in mine for s in b) for mine in batches]
    assert tokens == [100, 90]
    assert len(batches[0]) == len(batches[1]) == 3  # the first process's two are empty
    assert [len(b) for b in batches[1]] == [4, 4, 1]
    dealt = [id(s) for mine in batches for b in mine for s in b]
    assert sorted(dealt) == sorted(map(id, sequences))  # each once
