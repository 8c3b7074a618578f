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

Only the first process reads the weights (and a resumed optimizer's state): the others build the
model on the meta device and receive their shards from it (`shard_from_first`,
`sharded_optimizer_state`). Checkpoints stay whole: the first process gathers the weights and the
optimizer's state into the same files a single process writes, so a run resumes on any number of
GPUs.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from llm_trainer.distributed import Collective

T = TypeVar("T")


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


def shard_from_first(
    skeleton: Any, whole: Any, *, device: Any, bfloat16: bool, keep_gathered: bool = True
) -> Any:
    """`skeleton` (the model built on the meta device, on every process) sharded as `shard`
    does, its shards filled from the first process's `whole` model (None on the others), which
    is sent one tensor at a time: no other process ever holds the whole model."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model = shard(skeleton, bfloat16=bfloat16, keep_gathered=keep_gathered)
    model.to_empty(device=device)
    set_model_state_dict(
        model, whole.state_dict() if whole is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )  # fmt: skip
    # Buffers are whole on every process, and a non-persistent one (rotary frequencies) is in
    # no state dict.
    own = dict(whole.named_buffers()) if whole is not None else {}
    for name, buffer in model.named_buffers():
        if whole is not None:
            buffer.copy_(own[name])
        dist.broadcast(buffer, src=0)
    return model


def forward_pass(model: Any, function: Callable[..., T]) -> Callable[..., T]:
    """`function(model, ...)` bound to `model`; sharded, run as one of its forward passes: the
    root's weights gathered before and its gradients reduced after, as for `model(...)` (FSDP's
    `register_fsdp_forward_method`; for code that calls the model's parts itself)."""
    if not is_sharded(model):
        return functools.partial(function, model)
    from torch.distributed.fsdp import register_fsdp_forward_method

    name = f"_forward_{function.__name__}"
    if name not in vars(model):
        setattr(model, name, types.MethodType(function, model))
        register_fsdp_forward_method(model, name)
    return getattr(model, name)


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


@dataclass(frozen=True)
class _Travelling:
    """In the outline of an optimizer's state: a tensor shaped like its parameter, which the
    first process sends shard by shard."""

    shape: tuple[int, ...]
    dtype: Any


def sharded_optimizer_state(
    whole: dict[str, Any] | None, optimizer: Any, *, collective: Collective
) -> dict[str, Any]:
    """The first process's whole optimizer state (`gathered_optimizer_state` or one process's;
    None on the others) cut into every process's shards of `optimizer`'s parameters, ready for
    `load_state_dict`. Only the first process holds the whole state, one tensor at a time
    leaves it; the rest (step counts, the groups) reaches the others as one object."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    parameters = [p for group in optimizer.param_groups for p in group["params"]]

    def travels(value: Any, index: Any) -> bool:
        parameter = parameters[int(index)]
        return isinstance(parameter, DTensor) and getattr(value, "shape", None) == parameter.shape

    outline = None
    if whole is not None:
        outline = {
            **whole,
            "state": {
                index: {
                    name: _Travelling(tuple(value.shape), value.dtype)
                    if travels(value, index)
                    else value
                    for name, value in values.items()
                }
                for index, values in whole["state"].items()
            },
        }
    outline = collective.broadcast(outline)

    def shard_of(index: Any, name: str, value: Any) -> Any:
        if not isinstance(value, _Travelling):
            return value
        parameter = parameters[int(index)]
        if whole is not None:
            source = whole["state"][index][name].to(parameter.device)
        else:  # its content is the first process's, scattered
            source = torch.empty(value.shape, dtype=value.dtype, device=parameter.device)
        return distribute_tensor(
            source, parameter.device_mesh, parameter.placements, src_data_rank=0
        )

    moments = {
        index: {name: shard_of(index, name, value) for name, value in values.items()}
        for index, values in outline["state"].items()
    }
    return {**outline, "state": moments}
