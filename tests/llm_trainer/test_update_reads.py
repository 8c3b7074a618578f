"""The update queues every micro-batch without waiting for the device: none of its figures is
read back to the CPU (each read waits for the micro-batch's backward pass, and the GPU idles
while the next micro-batch is prepared) until the step ends. Counted in llm_trainer's own code
with a TorchFunctionMode, which sees every tensor method call and who made it."""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from llm_trainer import grpo, logprobs
from llm_trainer.grpo import Reference, training_sequences
from tests.llm_trainer.test_grpo import PROMPT, segment, update

OURS = {grpo.__file__, logprobs.__file__}
# What makes the CPU wait for the device: a value read back, or a boolean mask's selection
# (its size is only known there).
READS = {torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
         torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.nonzero}  # fmt: skip


class _HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.where: list[str] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        caller = sys._getframe(1)
        masked = func is torch.Tensor.__getitem__ and _boolean(args[1])
        if caller.f_code.co_filename in OURS and (func in READS or masked):
            self.where.append(f"{caller.f_code.co_name}:{caller.f_lineno}")
        return func(*args, **(kwargs or {}))


def _boolean(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype == torch.bool


def _reads(model: Any, micro_batches: int) -> list[str]:
    played = [
        (1.0 if number % 2 else -1.0, [segment(model, PROMPT, [40 + number, 41, 42 + number])])
        for number in range(2 * micro_batches)
    ]
    sequences = training_sequences(played)
    model = copy.deepcopy(model)
    with _HostReads() as reads:
        update(model, sequences, kl_coefficient=0.1, reference=Reference(model, lora=False))
    return reads.where


def test_a_step_reads_back_from_the_device_once_whatever_its_micro_batches(model: Any) -> None:
    one, four = _reads(model, 1), _reads(model, 4)
    assert one, "the counter sees the step's own reads"
    assert sorted(four) == sorted(one)
