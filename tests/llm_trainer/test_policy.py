"""The policy as the trainer loads it (llm_trainer/model.py): the update runs without dropout,
as generation samples, so that the importance ratio of an on-policy token is 1; a config cannot
ask for a LoRA dropout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from llm_trainer.grpo import next_token_logprobs
from llm_trainer.logprobs import SamplingDistribution
from llm_trainer.model import load_policy
from llm_trainer.tiny import tiny_model
from tests.llm_trainer.test_grpo import PROMPT
from training_configs.schema import load_training_config


@pytest.mark.parametrize("recipe", ["rft_multiturn_full", "rft_multiturn_lora"])
def test_the_update_runs_without_the_models_dropout(
    tmp_path: Path, tokenizer: Any, recipe: str
) -> None:
    """A model whose config sets an attention dropout (many Hub models carry one): loaded to
    train (training mode, which gradient checkpointing needs), two passes over the same tokens
    agree."""
    model = tiny_model(tokenizer)
    model.config.attention_dropout = 0.5
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    policy = load_policy(
        str(tmp_path / "model"), load_training_config(recipe), s3=None, workdir=tmp_path
    )
    assert policy.model.training
    ids = torch.tensor([PROMPT + [101, 102, 103]])
    torch.manual_seed(0)
    passes = [
        next_token_logprobs(policy.model, ids, torch.ones_like(ids), SamplingDistribution())
        for _ in range(2)
    ]
    assert torch.equal(passes[0], passes[1])


def test_a_lora_dropout_is_refused_with_why() -> None:
    config = load_training_config("rft_multiturn_lora").model_dump()
    config["lora"]["dropout"] = 0.05
    with pytest.raises(ValidationError, match="no trainer here takes a LoRA dropout"):
        type(load_training_config("rft_multiturn_lora")).model_validate(config)


@pytest.mark.parametrize("recipe", ["rft_multiturn_full", "rft_multiturn_lora"])
def test_gradient_checkpointing_changes_the_memory_not_the_step(
    tmp_path: Path, recipe: str
) -> None:
    """With `grpo.gradient_checkpointing` each layer's activations are recomputed in the
    backward pass: the same update, to float rounding."""
    from llm_trainer.grpo import LossSettings, grpo_update, training_sequences
    from tests.llm_trainer.test_grpo import segment

    base = load_training_config(recipe)
    after = []
    torch.manual_seed(0)
    untrained = {
        n: p.detach().clone()
        for n, p in load_policy("tiny", base, s3=None, workdir=tmp_path).model.named_parameters()
    }
    for checkpointing in (False, True):
        config = base.model_validate(
            {**base.model_dump(), "grpo": {"gradient_checkpointing": checkpointing}}
        )
        torch.manual_seed(0)  # the same adapter's initial weights
        policy = load_policy("tiny", config, s3=None, workdir=tmp_path)
        assert policy.model.is_gradient_checkpointing == checkpointing
        built = segment(policy.model, PROMPT, [101, 102, 103])
        optimizer = torch.optim.SGD(policy.trainable, lr=0.5)
        grpo_update(
            policy.model, optimizer, training_sequences([(1.0, [built])]),
            pad_id=0, settings=LossSettings(), micro_batch_size=2, max_grad_norm=10.0,
        )  # fmt: skip
        after.append({n: p.detach().clone() for n, p in policy.model.named_parameters()})
    assert after[0].keys() == after[1].keys()
    assert any(not torch.equal(after[0][n], p) for n, p in untrained.items())  # it moved
    assert all(torch.allclose(after[0][n], after[1][n], atol=1e-6) for n in after[0])
