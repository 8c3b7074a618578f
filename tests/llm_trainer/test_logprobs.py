"""The sampling distribution's log-probabilities (llm_trainer/logprobs.py): the cut that
transformers' own warpers make (the oracle: the code that samples), computed chunk by chunk as
the whole model computes them, and the same from the generator as from the update — so that the
importance ratio of an on-policy token is 1 whatever the temperature, top-k and top-p."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from llm_trainer.generation import SamplingSettings, TransformersGenerator
from llm_trainer.logprobs import (
    SamplingDistribution,
    _backbone_and_head,
    entropy_of,
    next_token_scores,
    processed_scores,
)
from tests.llm_trainer.test_grpo import PROMPT

DISTRIBUTIONS = [
    SamplingDistribution(),
    SamplingDistribution(temperature=0.7),
    SamplingDistribution(temperature=0.7, top_k=20),
    SamplingDistribution(temperature=1.3, top_p=0.8),
    SamplingDistribution(temperature=0.6, top_p=0.9, top_k=50),
    SamplingDistribution(top_p=0.05),  # keeps the most probable token alone
    SamplingDistribution(top_k=1),  # greedy
]


def warped(logits: torch.Tensor, distribution: SamplingDistribution) -> torch.Tensor:
    """What transformers' sampling does to the scores: its own warpers, in generate's order."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = TemperatureLogitsWarper(distribution.temperature)(None, logits.clone())
    if distribution.top_k:
        scores = TopKLogitsWarper(distribution.top_k)(None, scores)
    if distribution.top_p < 1:
        scores = TopPLogitsWarper(distribution.top_p)(None, scores)
    return scores


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=str)
def test_the_cut_distribution_is_the_one_transformers_samples_from(
    distribution: SamplingDistribution,
) -> None:
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(3)) * 3
    ours = torch.log_softmax(processed_scores(logits, distribution), dim=-1)
    theirs = torch.log_softmax(warped(logits, distribution), dim=-1)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = torch.isfinite(theirs)
    assert torch.allclose(ours[finite], theirs[finite], atol=1e-5)
    # Entropy of what is left, by hand.
    p = theirs.exp()
    expected = -(torch.where(finite, p * theirs, 0.0)).sum(dim=-1)
    assert torch.allclose(entropy_of(processed_scores(logits, distribution)), expected, atol=1e-5)


def _lora(model: Any) -> Any:
    from peft import LoraConfig, get_peft_model

    adapted = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.05)
    return adapted


@pytest.mark.parametrize(("lora", "chunk_tokens"), [(False, 6), (True, 6), (False, None)])
def test_chunked_log_probabilities_and_their_gradients_are_the_whole_models(
    model: Any, lora: bool, chunk_tokens: int | None
) -> None:
    """The head applied 3 tokens at a time (6 over the batch's two rows), each chunk recomputed
    in the backward pass — or the whole logits (`chunk_tokens` None) — against the model's own
    forward pass over the whole batch: two rows of 45 tokens (longer than the tiny model's
    hidden size), one padded; top-k and top-p on the batch's three dimensions."""
    policy = _lora(model) if lora else model
    completion = [101 + (7 * n) % 120 for n in range(40)]
    ids = torch.tensor([PROMPT + completion, PROMPT + completion[:30] + [0] * 10])
    attention = torch.tensor([[1] * 45, [1] * 35 + [0] * 10])
    distribution = SamplingDistribution(temperature=0.7, top_p=0.9, top_k=40)
    chunked = next_token_scores(
        policy, ids, attention, distribution, entropy=True, chunk_tokens=chunk_tokens
    )
    whole_policy = copy.deepcopy(policy)
    logits = whole_policy(input_ids=ids, attention_mask=attention).logits[:, :-1]
    scores = processed_scores(logits, distribution)
    expected = torch.log_softmax(scores, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(chunked.logprobs, expected, atol=1e-5)
    assert torch.allclose(chunked.entropy, entropy_of(scores), atol=1e-5)
    kept = attention[:, 1:].bool()
    chunked.logprobs[kept].sum().backward()
    expected[kept].sum().backward()
    for (name, mine), (_, theirs) in zip(
        policy.named_parameters(), whole_policy.named_parameters(), strict=True
    ):
        if mine.requires_grad:
            assert torch.allclose(mine.grad, theirs.grad, atol=1e-5), name


@pytest.mark.parametrize("distribution", DISTRIBUTIONS[2:5], ids=str)
def test_what_the_generator_reports_is_what_the_update_computes(
    model: Any, tokenizer: Any, distribution: SamplingDistribution
) -> None:
    """On-policy, every importance ratio is 1: the generator's behaviour log-probabilities of
    what it sampled under top-k and top-p are the update's for the same tokens."""
    generator = TransformersGenerator(
        model, stop_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id
    )
    settings = SamplingSettings(
        12, distribution.temperature, distribution.top_p, distribution.top_k
    )
    (sampled,) = generator.generate([PROMPT], settings, seed=5)
    ids = torch.tensor([PROMPT + sampled.token_ids])
    with torch.no_grad():
        scores = next_token_scores(model, ids, torch.ones_like(ids), distribution)
    trained = scores.logprobs[0, len(PROMPT) - 1 :]
    assert torch.isfinite(trained).all()  # every sampled token is inside the cut
    assert torch.allclose(trained, torch.tensor(sampled.logprobs), atol=1e-5)


def test_entropy_is_computed_only_when_asked(model: Any) -> None:
    ids = torch.tensor([PROMPT + [101, 102]])
    for chunk_tokens in (4, None):
        scores = next_token_scores(
            model, ids, torch.ones_like(ids), SamplingDistribution(), chunk_tokens=chunk_tokens
        )
        assert scores.entropy is None and scores.logprobs.shape == (1, 6)


def test_the_head_runs_in_chunks_for_plain_heads_only(model: Any) -> None:
    """Llama's (and a LoRA model's base's) body and head; a model type whose logits are more
    than its head's output (soft-capped, scaled) is called whole. (A sharded model's, run as
    one of its forward passes: tests/llm_trainer/test_distributed.py.)"""
    assert _backbone_and_head(model) == (model.model, model.lm_head)
    adapted = _lora(copy.deepcopy(model))
    base = adapted.get_base_model()
    assert _backbone_and_head(adapted) == (base.model, base.lm_head)
    ids = torch.tensor([PROMPT + [101, 102]])
    chunked = next_token_scores(model, ids, torch.ones_like(ids), SamplingDistribution())
    model.config.model_type = "gemma2"  # final_logit_softcapping
    assert _backbone_and_head(model) is None
    whole = next_token_scores(model, ids, torch.ones_like(ids), SamplingDistribution())
    assert torch.allclose(whole.logprobs, chunked.logprobs, atol=1e-6)


def test_a_tie_at_the_nucleus_edge_is_cut_as_transformers_cuts_it() -> None:
    """Four equal scores: the probabilities below each token are exactly 1/4, 1/2, 3/4, 1; at
    top_p 0.75 the token whose share below it is exactly 1 − p = 1/4 is cut (transformers'
    `<=`)."""
    logits = torch.zeros(2, 4)
    distribution = SamplingDistribution(top_p=0.75)
    ours = processed_scores(logits, distribution)
    assert torch.equal(torch.isinf(ours), torch.isinf(warped(logits, distribution)))
    assert torch.isinf(ours).sum(dim=-1).tolist() == [1, 1]
