"""Several trainer processes: two processes (gloo on the CPU, meeting through a file) that each
update on their share of a step's sequences end with the same weights, and the same weights as
one process updating on all of them — each holding a whole copy (LoRA), or half of the weights
and the optimizer's state (full fine-tuning, sharded)."""

from __future__ import annotations

import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_trainer.distributed import ALONE, TorchCollective
from llm_trainer.grpo import LossSettings, Reference, grpo_update, training_sequences
from llm_trainer.model import ModelNotLoaded, load_policy, reads_weights
from llm_trainer.sharding import gathered_optimizer_state, shards
from llm_trainer.tiny import save_tiny, tiny_model, tiny_tokenizer
from tests.llm_trainer.test_grpo import PROMPT, segment
from training_configs.schema import load_training_config


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
        model, torch.optim.SGD(model.parameters(), lr=0.5), sequences, pad_id=0,
        settings=LossSettings(), micro_batch_size=1, max_grad_norm=1.0, collective=collective,
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
        _leave(dist)


def _leave(dist: Any) -> None:
    """Leave the group together: a process that tears gloo down while the other still talks to
    it can abort the other ("terminate called without an active exception", seen once under
    load)."""
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("episodes", [6, 1])  # 1: the second process has nothing to learn from
def test_two_processes_take_the_step_one_process_takes_on_the_whole_batch(
    tmp_path: Path, episodes: int
) -> None:
    _spawn(_rank, (2, tmp_path, episodes))
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


# Full fine-tuning over several processes: the weights, gradients and optimizer state sharded.

PROBE = torch.tensor([PROMPT + [101, 102, 103]])


def _full_config(kl: float) -> Any:
    shipped = load_training_config("rft_multiturn_full")
    return shipped.model_validate({**shipped.model_dump(), "kl_coefficient": kl})


def _sharded_rank(
    rank: int, world_size: int, folder: Path, episodes: int, kl: float, optimizer: str
) -> None:
    """This process's part: load the tiny model sharded, update (_updates), gather the weights
    for generation and answer a probe, save a checkpoint (the first process writes it), then
    restore the optimizer's state from it into a fresh sharded policy and gather it again.
    Only the first process reads the weights and the optimizer's state: the second is given a
    model folder without weights and a state file that does not exist."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size
    )
    collective = TorchCollective(rank=rank, world_size=world_size)
    try:
        config, workdir = _full_config(kl), folder / f"rank-{rank}"
        source = str(folder / ("tiny" if rank == 0 else "tiny-without-weights"))
        policy = load_policy(
            source, config, s3=None, workdir=workdir, collective=collective,
            reference=bool(kl),
        )  # fmt: skip
        assert policy.sharded
        with shards(policy.model):  # the optimizer trains the shards
            optimize = _optimizer(policy.model, optimizer)
        reference = Reference(policy.model, lora=False, frozen=policy.frozen) if kl else None
        widths: list[int] = []  # the tokens of each call of the head (its weights gathered)
        hook = policy.model.lm_head.register_forward_hook(
            lambda _, inputs, __: widths.append(inputs[0].shape[0] * inputs[0].shape[1])
        )
        stats = _updates(policy.model, optimize, episodes, kl, reference, collective)
        hook.remove()
        policy.ready_to_generate()
        probe = None
        if rank == 1:  # generation alone: no collective (the other process would never join)
            with torch.no_grad():
                probe = policy.model(input_ids=PROBE).logits
        policy.save(folder / "saved", state=folder / "state.pt", optimizer=optimize, step=2)
        collective.gather(None)  # the checkpoint is written before anyone reads it
        fresh = load_policy(source, config, s3=None, workdir=workdir, collective=collective)
        with shards(fresh.model):
            restored = _optimizer(fresh.model, optimizer)
        step = fresh.restore_optimizer(folder / ("state.pt" if rank == 0 else "absent"), restored)
        regathered = gathered_optimizer_state(restored, keep=rank == 0)
        torch.save(
            {
                "stats": stats,
                "probe": probe,
                "step": step,
                "regathered": regathered,
                "head_widths": widths,
            },  # fmt: skip
            folder / f"rank-{rank}.pt",
        )
    finally:
        _leave(dist)


def _tiny_with_and_without_weights(folder: Path) -> None:
    save_tiny(folder / "tiny")  # before the group exists: transformers writes on rank 0 only
    outline = shutil.copytree(folder / "tiny", folder / "tiny-without-weights")
    for weights in outline.glob("*.safetensors"):
        weights.unlink()


def _spawn(part: Any, args: tuple[Any, ...], *, bound_seconds: float = 300) -> None:
    """Two processes running `part`, failing the test (not hanging it) if they do not finish:
    a collective only one process enters waits forever."""
    processes = torch.multiprocessing.spawn(part, args=args, nprocs=2, join=False)
    deadline = time.monotonic() + bound_seconds
    while not processes.join(timeout=1):
        if time.monotonic() > deadline:
            for process in processes.processes:
                process.kill()
            pytest.fail(f"the two processes did not finish within {bound_seconds} s")


def _optimizer(model: Any, kind: str) -> Any:
    if kind == "sgd":  # the step is the gradient (see _updated)
        return torch.optim.SGD(model.parameters(), lr=0.5)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)


def _updates(
    model: Any, optimizer: Any, episodes: int, kl: float, reference: Any, collective: Any
) -> list[dict[str, float]]:
    """Two SGD updates (the second pulled by the KL term, if any: the model has moved), one
    AdamW update: its first step turns rounding-sized gradients into whole learning rates (see
    _updated), so that its moments compare and the weights it moves next would not. The head
    runs over 3 tokens at a time (several chunks, recomputed in the backward pass)."""
    sequences = _sequences(tiny_model(tiny_tokenizer(), seed=0), episodes)
    stats = []
    for _ in range(2 if isinstance(optimizer, torch.optim.SGD) else 1):
        update = grpo_update(
            model, optimizer, sequences, pad_id=0, settings=LossSettings(kl_coefficient=kl, chunk_tokens=3),
            micro_batch_size=2, max_grad_norm=1.0, reference=reference, collective=collective,
        )  # fmt: skip
        stats.append(asdict(update))
    return stats


@pytest.mark.parametrize(
    ("episodes", "kl", "optimizer"),
    [
        (5, 0.0, "sgd"),  # the second process has one micro-batch fewer: it runs an empty one
        (1, 0.5, "sgd"),  # the second process has nothing to learn from; the KL term pulls
        (3, 0.0, "adamw"),  # the optimizer's moments, gathered and cut again
    ],
)
def test_two_processes_sharing_the_weights_take_the_step_one_process_takes(
    tmp_path: Path, episodes: int, kl: float, optimizer: str
) -> None:
    from transformers import AutoModelForCausalLM

    _tiny_with_and_without_weights(tmp_path)
    _spawn(_sharded_rank, (2, tmp_path, episodes, kl, optimizer))
    ranks = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False) for rank in (0, 1)]
    alone = tiny_model(tiny_tokenizer(), seed=0)
    optimize = _optimizer(alone, optimizer)
    stats = _updates(alone, optimize, episodes, kl, Reference(alone, lora=False), ALONE)
    # The checkpoint: a whole model a single process (or a server) loads as it is.
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert type(saved).__name__ == "LlamaForCausalLM"
    untrained = tiny_model(tiny_tokenizer(), seed=0).state_dict()
    assert any(not torch.equal(untrained[name], w) for name, w in saved.state_dict().items())
    if optimizer == "sgd":  # Adam's moments are compared instead (below)
        weights = saved.state_dict()
        for name, weight in alone.state_dict().items():
            assert torch.allclose(weights[name], weight, atol=1e-6), name
        # A process generates with the updated weights, gathered, on its own.
        with torch.no_grad():
            expected = alone(input_ids=PROBE).logits
        assert torch.allclose(ranks[1]["probe"], expected, atol=1e-5)
    for rank in ranks:  # the head ran over at most 3 tokens at a time
        assert rank["head_widths"] and max(rank["head_widths"]) <= 3
        for mine, theirs in zip(rank["stats"], stats, strict=True):
            for key in ("objective", "kl", "clipped_fraction"):
                assert mine[key] == pytest.approx(theirs[key], abs=1e-6), key
    if kl:
        assert stats[1]["kl"] > 0  # the second update was pulled back towards the reference
    # The optimizer's state: what one process has, in one process's format; restored into
    # shards, it gathers back to the same.
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert state["step"] == ranks[1]["step"] == 2
    single = optimize.state_dict()["state"]
    assert state["optimizer"]["state"].keys() == single.keys()
    for index, moments in single.items():
        for name, value in moments.items():
            assert torch.allclose(state["optimizer"]["state"][index][name], value, atol=1e-6)
            regathered = ranks[0]["regathered"]["state"][index][name]
            assert torch.equal(regathered, state["optimizer"]["state"][index][name])


def _unreadable_rank(rank: int, world_size: int, folder: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        load_policy(
            str(folder / "tiny-without-weights"), _full_config(0.0), s3=None,
            workdir=folder / f"rank-{rank}",
            collective=TorchCollective(rank=rank, world_size=world_size),
        )  # fmt: skip
    except ModelNotLoaded as error:
        (folder / f"rank-{rank}.txt").write_text(str(error))
    finally:
        _leave(dist)


def test_weights_the_first_process_cannot_read_stop_every_process_with_why(
    tmp_path: Path,
) -> None:
    """The others wait for their shards from the first: its error reaches them too."""
    _tiny_with_and_without_weights(tmp_path)
    _spawn(
        _unreadable_rank,
        (
            2,
            tmp_path,
        ),
        bound_seconds=120,
    )
    said = [(tmp_path / f"rank-{rank}.txt").read_text() for rank in (0, 1)]
    assert said[0] == said[1]
    assert said[0].startswith(f"model {tmp_path / 'tiny-without-weights'}: ")
    assert "model.safetensors" in said[0]


@pytest.mark.parametrize(
    ("recipe", "rank", "world_size", "reads"),
    [
        ("rft_multiturn_full", 0, 1, True),
        ("rft_multiturn_full", 0, 2, True),
        ("rft_multiturn_full", 1, 2, False),  # receives its shards from the first
        ("rft_multiturn_lora", 1, 2, True),  # a whole copy of the base on every process
    ],
)
def test_which_processes_read_the_weights(
    recipe: str, rank: int, world_size: int, reads: bool
) -> None:
    collective = TorchCollective(rank=rank, world_size=world_size)
    assert reads_weights(load_training_config(recipe), collective) is reads
