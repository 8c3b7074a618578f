"""Several trainer processes: two processes (gloo on the CPU, meeting through a file) that each
update on their share of a step's sequences end with the same weights, and the same weights as
one process updating on all of them."""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_trainer.distributed import ALONE, TorchCollective
from llm_trainer.grpo import grpo_update, training_sequences
from llm_trainer.tiny import tiny_model, tiny_tokenizer
from tests.llm_trainer.test_grpo import PROMPT, segment


def _sequences(model: Any, episodes: int) -> list[Any]:
    rng = random.Random(0)
    played = []
    for number in range(episodes):
        completion = [rng.randrange(32, 256) for _ in range(2 + number)]
        played.append((1.0 if number % 2 else -1.0, [segment(model, PROMPT, completion)]))
    return training_sequences(played)


def _updated(episodes: int, collective: Any) -> dict[str, Any]:
    """The weights after one update (plain SGD: the step is the gradient, where Adam's first
    step would turn a gradient's rounding-sized sign into a whole learning rate)."""
    model = tiny_model(tiny_tokenizer(), seed=0)
    sequences = _sequences(model, episodes)
    stats = grpo_update(
        model, torch.optim.SGD(model.parameters(), lr=0.5), sequences, pad_id=0, clip_ratio=0.2,
        temperature=1.0, micro_batch_size=1, max_grad_norm=1.0, collective=collective,
    )  # fmt: skip
    return {"weights": model.state_dict(), "stats": asdict(stats)}


def _rank(rank: int, world_size: int, folder: Path, episodes: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        torch.save(
            _updated(episodes, TorchCollective(rank=rank, world_size=world_size)),
            folder / f"rank-{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("episodes", [6, 1])  # 1: the second process has nothing to learn from
def test_two_processes_take_the_step_one_process_takes_on_the_whole_batch(
    tmp_path: Path, episodes: int
) -> None:
    torch.multiprocessing.spawn(_rank, args=(2, tmp_path, episodes), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False) for rank in (0, 1)]
    alone = _updated(episodes, ALONE)
    for name, weight in alone["weights"].items():
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name]), name
        assert torch.allclose(ranks[0]["weights"][name], weight, atol=1e-6), name
    moved = tiny_model(tiny_tokenizer(), seed=0).state_dict()
    assert any(not torch.equal(moved[name], w) for name, w in alone["weights"].items())
    for key in ("objective", "kl", "clipped_fraction"):
        assert ranks[0]["stats"][key] == ranks[1]["stats"][key]
        assert ranks[0]["stats"][key] == pytest.approx(alone["stats"][key], abs=1e-6)
