"""Full fine-tuning over a node's GPUs with the weights, gradients and optimizer state sharded
(PyTorch's FSDP2, `fully_shard`): each process keeps 1/N of the float32 weights and AdamW's two
moments, which is what lets a model too large for one GPU's copy (8 B and up) train on a node.

Shards are per decoder layer (the model's `_no_split_modules`, as accelerate wraps them) and the
rest at the root. The gathered weights stay in place after a forward pass: generation, which each
process runs on its own requests and so a different number of times, then needs no collective
(it calls `model.generate(synced_gpus=False)`); every process gathers them together once after
each update (`gather_for_generation`). An update's micro-batches run in lockstep on every process
(llm_trainer/grpo.py), since each backward pass reduces the gradients' shards over the processes
— summed, not averaged, like the replicated processes' gradients.

Checkpoints stay whole: the first process gathers the weights and the optimizer's state into the
same files a single process writes, so a run resumes on any number of GPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def shard(model: Any, *, bfloat16: bool, keep_gathered: bool = True) -> Any:
    """`model`, sharded over the processes' group (joined already). `bfloat16`: the gathered
    weights (forward passes, generation) are bfloat16, the shards that train stay float32.
    `keep_gathered` False frees the gathered weights after each forward pass (a frozen reference
    model, used once per micro-batch)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    precision = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bfloat16
        else MixedPrecisionPolicy()
    )
    layers = set(getattr(model, "_no_split_modules", None) or ())
    units = [module for module in model.modules() if type(module).__name__ in layers] + [model]
    for unit in units:
        fully_shard(unit, reshard_after_forward=not keep_gathered, mp_policy=precision)
        # Summed: the sequences' weights are shares of the whole step (grpo.py). A plain SUM,
        # not NCCL's pre-multiplied one, which gloo (the CPU's backend) does not have.
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def is_sharded(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _units(model: Any) -> list[Any]:
    """The model's sharded modules, in the same order on every process (each gathers or frees
    only its own weights)."""
    from torch.distributed.fsdp import FSDPModule

    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def gather_for_generation(model: Any) -> None:
    """Every process, together: the whole (updated) weights gathered for generation."""
    for unit in _units(model):
        unit.unshard()


@contextlib.contextmanager
def shards(model: Any) -> Iterator[Any]:
    """Within: the model's parameters are its float32 shards — what an optimizer is built on
    and a checkpoint saves (gathered, they are other tensors, bfloat16 on a GPU). After: gathered
    for generation again (every process, together)."""
    for unit in _units(model):
        unit.reshard()
    yield model
    gather_for_generation(model)


def _whole(value: Any, keep: bool) -> Any:
    """A shard's whole tensor on the CPU (every process takes part; only `keep` holds it)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        whole = value.full_tensor()
        return whole.cpu() if keep else None
    return value


def gathered_weights(model: Any, *, keep: bool) -> dict[str, Any]:
    """The model's state dict with whole tensors (`keep`: on this process; others get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # cpu_offload: whole tensors reach the first process only, one at a time.
    whole = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return whole if keep else {}


def gathered_optimizer_state(optimizer: Any, *, keep: bool) -> dict[str, Any]:
    """The optimizer's state dict with whole tensors, as one process's optimizer writes it."""
    state = optimizer.state_dict()
    moments = {
        index: {name: _whole(value, keep) for name, value in values.items()}
        for index, values in state["state"].items()
    }
    return {**state, "state": moments} if keep else {}


def sharded_optimizer_state(state: dict[str, Any], optimizer: Any) -> dict[str, Any]:
    """A whole optimizer state (`gathered_optimizer_state` or one process's) cut into this
    process's shards of `optimizer`'s parameters, ready for `load_state_dict`."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    parameters = [p for group in optimizer.param_groups for p in group["params"]]

    def cut(value: Any, parameter: Any) -> Any:
        if isinstance(parameter, DTensor) and getattr(value, "shape", None) == parameter.shape:
            # src_data_rank None: each process cuts its shard from its own copy, no traffic.
            return distribute_tensor(
                value.to(parameter.device), parameter.device_mesh, parameter.placements,
                src_data_rank=None,
            )  # fmt: skip
        return value

    moments = {
        index: {name: cut(value, parameters[int(index)]) for name, value in values.items()}
        for index, values in state["state"].items()
    }
    return {**state, "state": moments}
