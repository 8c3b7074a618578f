"""Several trainer processes on one node, one per GPU (`torchrun --nproc-per-node=gpu -m
llm_trainer`): every process answers generate requests from the run's queue with the whole
weights; the first (rank 0) plays the steps, gathers what every process sampled, and hands each
its share of the step's sequences; their gradients are summed before one identical optimizer
step everywhere. A LoRA model is copied to every process; a fully fine-tuned one is sharded over
them (sharding.py), its whole weights gathered for generation after each update.

`Collective` is what the trainer needs of the processes' group; `ALONE` is one process by itself.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Collective(Protocol):
    rank: int
    world_size: int

    def broadcast(self, value: T | None) -> T:
        """Rank 0's `value`, on every rank."""

    def gather(self, value: T) -> list[T]:
        """Every rank's `value`, in rank order, on every rank."""

    def sum(self, values: Sequence[float]) -> list[float]:
        """The element-wise sum of every rank's `values`."""

    def sum_gradients(self, parameters: Iterable[Any]) -> None:
        """Each parameter's gradient summed over the ranks (a missing one counts as zeros)."""

    def join(self) -> None:
        """The group joined now (before sharding a model over it), not at the first call."""


class Alone:
    rank, world_size = 0, 1

    def broadcast(self, value: Any) -> Any:
        return value

    def gather(self, value: Any) -> list[Any]:
        return [value]

    def sum(self, values: Sequence[float]) -> list[float]:
        return list(values)

    def sum_gradients(self, parameters: Iterable[Any]) -> None:
        """Nothing to add."""

    def join(self) -> None:
        """No group to join."""


ALONE = Alone()


class TorchCollective:
    """The default process group of `torch.distributed` (NCCL between GPUs, gloo on CPUs),
    joined at the first collective call: each process loads (and, for the tiny model, writes)
    its model alone first — transformers' `save_pretrained` writes on rank 0 only once a group
    exists."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    @functools.cached_property
    def _dist(self) -> Any:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        return dist

    def join(self) -> None:
        self._dist.barrier()

    def broadcast(self, value: Any) -> Any:
        box = [value]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(gathered, value)
        return gathered

    def sum(self, values: Sequence[float]) -> list[float]:
        import torch

        tensor = torch.tensor(list(values), dtype=torch.float64, device=self._device())
        self._dist.all_reduce(tensor)
        return [float(value) for value in tensor.tolist()]

    def sum_gradients(self, parameters: Iterable[Any]) -> None:
        import torch

        for parameter in parameters:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            self._dist.all_reduce(parameter.grad)

    def _device(self) -> Any:
        import torch

        nccl = self._dist.get_backend() == "nccl"
        return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def from_environment() -> Collective:
    """The group torchrun started this process in (its variables say so), else `ALONE`."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return ALONE
    import torch

    if torch.cuda.is_available():  # this process's GPU, before the model is put on one
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return TorchCollective(rank=int(os.environ["RANK"]), world_size=world_size)
