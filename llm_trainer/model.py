"""The policy being trained: a Hugging Face causal LM and its tokenizer, wrapped in a LoRA
adapter (PEFT) when the recipe is RFT_MULTITURN_LORA, every weight trained when it is
RFT_MULTITURN_FULL; its optimizer; saving it to a checkpoint folder and loading it back. With
several processes, a fully fine-tuned model is sharded over them (sharding.py); a LoRA model's
frozen base is small enough in bfloat16 to be copied to each.

Where the weights come from (`TrainingJob.model_source`, else the config's `model`): `tiny` (a
small model built here, tiny.py), a local directory, `s3://bucket/prefix/` (downloaded at run
time), or a Hugging Face Hub id (downloaded at run time; a gated one with the token its
preset's `hub_token_secret` holds, hub_token.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_trainer import sharding
from llm_trainer.checkpoints import download_model
from llm_trainer.distributed import ALONE, Collective
from llm_trainer.grpo import frozen_copy
from llm_trainer.tiny import TINY, save_tiny
from training_configs.schema import TrainingConfig

log = logging.getLogger("mtrl.trainer")
ADAPTER_CONFIG = "adapter_config.json"


class ModelNotLoaded(RuntimeError):
    """The model or a checkpoint cannot be loaded; the message says which and why."""


def shards_weights(config: TrainingConfig, collective: Collective) -> bool:
    """Whether the processes shard the model (a full fine-tune on several): a LoRA model's
    frozen base is copied to each instead."""
    return config.lora is None and collective.world_size > 1


def reads_weights(config: TrainingConfig, collective: Collective) -> bool:
    """Whether this process reads the model's weights: every process but the first of several
    that shard a model receives its shards instead (`_sharded`)."""
    return not shards_weights(config, collective) or collective.rank == 0


def model_folder(source: str, *, s3: Any, workdir: Path, weights: bool = True) -> str:
    """A folder (or Hub id) `from_pretrained` reads for `source`; `weights` False: an S3
    source's folder without its weights (`checkpoints.download_model`)."""
    if source == TINY:
        folder = workdir / "tiny"
        if not (folder / "config.json").exists():
            save_tiny(folder)
        return str(folder)
    if source.startswith("s3://"):
        try:
            return str(download_model(s3, source, workdir / "model", weights=weights))
        except LookupError as error:
            raise ModelNotLoaded(f"model {source}: {error}") from None
    return source


@dataclass
class Policy:
    model: Any
    tokenizer: Any
    lora: bool
    device: Any
    base: str  # the folder or Hub id the base weights were read from (what vLLM serves)
    collective: Collective = ALONE
    frozen: Any = None  # full fine-tuning with a KL term: the reference model (sharded alike)

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded over the processes (full fine-tuning on several)."""
        return sharding.is_sharded(self.model)

    def autocast(self) -> Any:
        """Where forward passes run in bfloat16: on a GPU; on a CPU, as they are."""
        import contextlib

        import torch

        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @property
    def trainable(self) -> list[Any]:
        return [parameter for parameter in self.model.parameters() if parameter.requires_grad]

    def optimizer(self, learning_rate: float) -> Any:
        import torch

        with self._shards():
            return torch.optim.AdamW(self.trainable, lr=learning_rate, weight_decay=0.0)

    def _shards(self) -> AbstractContextManager[Any]:
        return sharding.shards(self.model) if self.sharded else nullcontext()

    def ready_to_generate(self) -> None:
        """Every process, after loading and after each update: sharded weights gathered, so
        that each process generates on its own."""
        if self.sharded:
            sharding.gather_for_generation(self.model)

    def save(self, folder: Path, *, state: Path, optimizer: Any, step: int) -> None:
        """The adapter (LoRA) or the whole model and its tokenizer into `folder`; into `state`
        what a restarted job needs besides: the optimizer's state and the step. Sharded, every
        process calls it (they gather the shards together); the first one writes."""
        import torch

        writes, weights, moments = self.collective.rank == 0, None, None
        if self.sharded:
            with self._shards():
                weights = sharding.gathered_weights(self.model, keep=writes)
            moments = sharding.gathered_optimizer_state(optimizer, keep=writes)
        if not writes:
            return
        self.model.save_pretrained(folder, state_dict=weights)
        if not self.lora:
            self.tokenizer.save_pretrained(folder)
        if moments is None:
            moments = optimizer.state_dict()
        torch.save({"optimizer": moments, "step": step}, state)

    def restore_optimizer(self, path: Path, optimizer: Any) -> int:
        """The optimizer's state saved with `save`, and its step. Sharded, every process calls
        it and only the first reads `path`: the others receive their shards of the state."""
        import torch

        if not self.sharded:
            state = torch.load(path, weights_only=True, map_location=self.device)
            optimizer.load_state_dict(state["optimizer"])
            return int(state["step"])
        first = self.collective.rank == 0
        state = torch.load(path, weights_only=True, map_location="cpu") if first else None
        moments = sharding.sharded_optimizer_state(
            state["optimizer"] if state is not None else None, optimizer,
            collective=self.collective,
        )  # fmt: skip
        optimizer.load_state_dict(moments)
        return int(self.collective.broadcast(state["step"] if state is not None else None))


def load_policy(
    source: str,
    config: TrainingConfig,
    *,
    s3: Any,
    workdir: Path,
    checkpoint: Path | None = None,
    collective: Collective = ALONE,
    reference: bool = False,
    reference_checkpoint: Path | None = None,
) -> Policy:
    """The policy to train or evaluate: from `source`, or from a checkpoint folder of it.
    `reference`: keep a frozen model to pull towards (full fine-tuning; LoRA's is its base):
    the weights training started from — `reference_checkpoint` (a run's base checkpoint), else
    `source` — never a resumed run's own checkpoint, so that a restarted job keeps its
    objective."""
    import torch
    from transformers import AutoTokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # Weights that train stay in float32 (a bfloat16 weight loses updates smaller than its
    # precision); the frozen base of a LoRA model may be bfloat16 on a GPU, its adapter is
    # float32 (PEFT's default). The forward passes run in bfloat16 there (`Policy.autocast`).
    dtype = torch.bfloat16 if device.type == "cuda" and config.lora is not None else torch.float32
    lora = config.lora is not None
    base = model_folder(source, s3=s3, workdir=workdir, weights=reads_weights(config, collective))
    full_checkpoint = checkpoint is not None and not lora
    weights = str(checkpoint) if full_checkpoint else base
    try:
        tokenizer = AutoTokenizer.from_pretrained(weights)
    except (OSError, ValueError) as error:
        raise ModelNotLoaded(f"model {weights}: {error}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    starting = None
    if reference and not lora:
        starting = str(reference_checkpoint) if reference_checkpoint is not None else base
    if shards_weights(config, collective):
        # Several processes share a fully fine-tuned model: its shards go to this process's
        # GPU, the whole model never does.
        collective.join()
        model, frozen = _sharded(weights, starting, collective=collective, device=device)
    else:
        model = _pretrained(weights, dtype, what="model")
        if lora:
            model = _with_adapter(model, config, checkpoint)
        frozen = None
        if starting is not None:
            frozen = frozen_copy(
                model
                if starting == weights
                else _pretrained(starting, dtype, what="reference model")
            )
            frozen.to(device)
        model.to(device)
    model.train()
    without_dropout(model)
    if config.grpo.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy = Policy(
        model=model, tokenizer=tokenizer, lora=lora, device=device, base=base,
        collective=collective, frozen=frozen,
    )  # fmt: skip
    policy.ready_to_generate()
    return policy


def _sharded(
    weights: str, starting: str | None, *, collective: Collective, device: Any
) -> tuple[Any, Any]:
    """The model in `weights` and, given `starting`, the frozen reference, sharded over the
    processes with float32 shards. Only the first process reads the weights (one whole copy in
    a node's memory, not one per GPU); the others build the model empty from its config and
    receive their shards."""
    import torch

    def whole(folder: str, what: str) -> Any:
        return _first_reads(
            lambda: _pretrained(folder, torch.float32, what=what), collective=collective
        )

    bfloat16 = device.type == "cuda"
    read = whole(weights, "model")
    model = sharding.shard_from_first(
        _empty(weights, what="model"), read, device=device, bfloat16=bfloat16
    )
    if starting is None:
        return model, None
    if starting != weights:
        read = whole(starting, "reference model")
    frozen = sharding.shard_from_first(
        frozen_copy(_empty(starting, what="reference model")), read, device=device,
        bfloat16=bfloat16, keep_gathered=False,
    )  # fmt: skip
    return model, frozen


def _first_reads(load: Callable[[], Any], *, collective: Collective) -> Any:
    """What `load` returns on the first process (None on the others); its ModelNotLoaded
    raised on every process (the others would otherwise wait for shards that never come)."""
    loaded, problem = None, None
    if collective.rank == 0:
        try:
            loaded = load()
        except ModelNotLoaded as error:
            problem = str(error)
    problem = collective.broadcast(problem)
    if problem is not None:
        raise ModelNotLoaded(problem)
    return loaded


def _empty(weights: str, *, what: str) -> Any:
    """The causal LM described in `weights`' config, on the meta device (no memory, no weights
    read), float32, with its generation defaults."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(weights)
    except (OSError, ValueError) as error:
        raise ModelNotLoaded(f"{what} {weights}: {error}") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with suppress(OSError):  # none saved: the config's own, as from_pretrained keeps
        model.generation_config = GenerationConfig.from_pretrained(weights)
    return model


def _pretrained(weights: str, dtype: Any, *, what: str) -> Any:
    """The causal LM in `weights`; ModelNotLoaded naming `what` it is and why not."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(weights, dtype=dtype)
    except (OSError, ValueError) as error:
        raise ModelNotLoaded(f"{what} {weights}: {error}") from None


def without_dropout(model: Any) -> None:
    """Every dropout of `model` off, in training mode too: generation samples without it (in
    evaluation mode), so an update with it would take a ratio of two different policies even
    on-policy. Training mode stays (gradient checkpointing needs it)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0  # transformers' attention modules: a rate, no module


def _with_adapter(model: Any, config: TrainingConfig, checkpoint: Path | None) -> Any:
    from peft import LoraConfig, PeftModel, get_peft_model

    if checkpoint is not None:
        if not (checkpoint / ADAPTER_CONFIG).exists():
            raise ModelNotLoaded(
                f"checkpoint {checkpoint.name} has no LoRA adapter ({ADAPTER_CONFIG}): it is not "
                "from a LoRA run; start a RFT_MULTITURN_FULL run from it instead"
            )
        try:
            return PeftModel.from_pretrained(model, str(checkpoint), is_trainable=True)
        except (RuntimeError, ValueError) as error:
            raise ModelNotLoaded(
                f"checkpoint {checkpoint.name} does not fit this model ({error}); start from a "
                "checkpoint of the same base model"
            ) from None
    settings = config.lora
    assert settings is not None
    adapter = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, adapter)
