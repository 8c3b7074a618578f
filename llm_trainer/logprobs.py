"""The log-probability of each next token under the distribution generation samples from, and
that distribution's entropy — for the behaviour log-probabilities a generator reports and the
ones the update takes its importance ratio against, so that both are of one distribution.

The sampling distribution of the logits z: z / temperature, then top-k (the k highest scores
kept), then top-p (the smallest set of the highest-probability tokens whose probability reaches
p: a token is cut when the probability of the tokens below it, itself included, is at most
1 − p; the most probable always stays) — the order and the rules of transformers'
`TopKLogitsWarper` and `TopPLogitsWarper`, and of vLLM's sampler, whose
`logprobs_mode="processed_logprobs"` reports this distribution's log-probabilities. A token cut
from it has log-probability −∞.

Memory: a model's logits are (tokens × vocabulary); for a Qwen3 vocabulary (151,936) 10,240
tokens are 6.2 GB in float32, and log-softmax makes another. For a model whose head is a plain
linear layer over the last hidden state (PLAIN_HEADS), the head runs here chunk by chunk, each
chunk's scores recomputed in the backward pass instead of kept (`torch.utils.checkpoint`), so
one chunk's are alive at a time — a model sharded over processes too, the body and head run as
one of its forward passes (sharding.forward_pass: FSDP gathers the root's weights, the head's
among them, only for those). Other models take their whole logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_trainer.sharding import forward_pass
from training_configs.schema import TrainingConfig

# Architectures whose causal-LM forward is `lm_head(backbone(...).last_hidden_state)`, with no
# scaling or soft-capping of the logits after (transformers' modeling files).
PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
# Tokens whose scores are alive at once on the chunked path.
DEFAULT_CHUNK_TOKENS = 1024


@dataclass(frozen=True)
class SamplingDistribution:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut


def sampling_distribution(config: TrainingConfig) -> SamplingDistribution:
    """The distribution the run's `grpo` section samples from."""
    grpo = config.grpo
    return SamplingDistribution(grpo.temperature, grpo.top_p, grpo.top_k)


@dataclass(frozen=True)
class TokenScores:
    logprobs: Any  # (batch, length − 1): log π(token i+1 | tokens ≤ i)
    entropy: Any  # (batch, length − 1), no gradient: the entropy of π(· | tokens ≤ i); or None


def processed_scores(logits: Any, distribution: SamplingDistribution) -> Any:
    """Float32 scores over the last dimension whose log-softmax is the sampling distribution
    (cut tokens at −∞)."""
    import torch

    scores = logits.float() / distribution.temperature
    vocabulary = scores.shape[-1]
    if 0 < distribution.top_k < vocabulary:
        kth = torch.topk(scores, distribution.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if distribution.top_p < 1.0:
        ascending, order = torch.sort(scores, dim=-1)
        cut = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - distribution.top_p
        cut[..., -1] = False
        scores = scores.masked_fill(cut.scatter(-1, order, cut), float("-inf"))
    return scores


def chosen_logprobs(scores: Any, targets: Any) -> Any:
    """log-softmax(scores) at `targets` (scores' shape less the last dimension)."""
    import torch

    chosen = scores.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(scores, dim=-1)


def entropy_of(scores: Any) -> Any:
    """The entropy of softmax(scores) over the last dimension (a cut token adds nothing)."""
    import torch

    with torch.no_grad():
        logprobs = torch.log_softmax(scores, dim=-1)
        terms = torch.where(torch.isfinite(logprobs), logprobs.exp() * logprobs, 0.0)
        return -terms.sum(dim=-1)


def next_token_scores(
    model: Any,
    ids: Any,
    attention: Any,
    distribution: SamplingDistribution,
    *,
    entropy: bool = False,
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS,
) -> TokenScores:
    """Each next token's log-probability under `distribution` (and, `entropy`, the
    distribution's entropy there), from `model`'s forward pass over `ids`; `chunk_tokens`
    None: from the model's whole logits."""
    if chunk_tokens is None or _backbone_and_head(model) is None:
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        scores = processed_scores(logits, distribution)
        return TokenScores(
            chosen_logprobs(scores, ids[:, 1:]), entropy_of(scores) if entropy else None
        )
    in_chunks = forward_pass(model, _scores_in_chunks)
    logprobs, spread = in_chunks(ids, attention, distribution, entropy, chunk_tokens)
    return TokenScores(logprobs, spread)


def _backbone_and_head(model: Any) -> tuple[Any, Any] | None:
    """The model's body and its output layer, where its logits are the one applied to the
    other's last hidden state; None: call the model whole."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(inner.config, "model_type", None) not in PLAIN_HEADS:
        return None
    backbone = getattr(inner, inner.base_model_prefix, None)
    head = inner.get_output_embeddings()
    if backbone is None or head is None:
        return None
    return backbone, head


def _scores_in_chunks(
    model: Any,
    ids: Any,
    attention: Any,
    distribution: SamplingDistribution,
    entropy: bool,
    chunk_tokens: int,
) -> tuple[Any, Any]:
    """`next_token_scores` of a plain-headed model, the head in chunks; a tuple of tensors,
    whose gradients FSDP follows (its hooks find tensors in tuples, not in dataclasses)."""
    parts = _backbone_and_head(model)
    assert parts is not None
    backbone, head = parts
    hidden = backbone(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1]
    scores = _chunked(
        hidden, ids[:, 1:], head, distribution, entropy=entropy, chunk_tokens=chunk_tokens
    )
    return scores.logprobs, scores.entropy


def _chunked(
    hidden: Any,
    targets: Any,
    head: Any,
    distribution: SamplingDistribution,
    *,
    entropy: bool,
    chunk_tokens: int,
) -> TokenScores:
    import torch
    from torch.utils.checkpoint import checkpoint

    def scored(part: Any, chosen: Any) -> tuple[Any, Any]:
        scores = processed_scores(head(part), distribution)
        return chosen_logprobs(scores, chosen), (entropy_of(scores) if entropy else None)

    width = max(1, chunk_tokens // max(hidden.shape[0], 1))
    logprobs, entropies = [], []
    for start in range(0, hidden.shape[1], width):
        part, chosen = hidden[:, start : start + width], targets[:, start : start + width]
        if torch.is_grad_enabled():
            # The chunk's scores are recomputed in the backward pass rather than kept.
            values, spread = checkpoint(scored, part, chosen, use_reentrant=False)
        else:
            values, spread = scored(part, chosen)
        logprobs.append(values)
        entropies.append(spread)
    return TokenScores(torch.cat(logprobs, dim=1), torch.cat(entropies, dim=1) if entropy else None)
