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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.bucket import download_folder
from llm_trainer import sharding
from llm_trainer.distributed import ALONE, Collective
from llm_trainer.grpo import frozen_copy
from llm_trainer.tiny import TINY, save_tiny
from training_configs.schema import TrainingConfig

log = logging.getLogger("mtrl.trainer")
ADAPTER_CONFIG = "adapter_config.json"


class ModelNotLoaded(RuntimeError):
    """The model or a checkpoint cannot be loaded; the message says which and why."""


def model_folder(source: str, *, s3: Any, workdir: Path) -> str:
    """A folder (or Hub id) `from_pretrained` reads for `source`."""
    if source == TINY:
        folder = workdir / "tiny"
        if not (folder / "config.json").exists():
            save_tiny(folder)
        return str(folder)
    if source.startswith("s3://"):
        try:
            return str(download_folder(s3, source, workdir / "model"))
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
        """The optimizer's state saved with `save`, and its step."""
        import torch

        # Sharded, the whole state stays on the CPU: each process moves only its shards.
        where = "cpu" if self.sharded else self.device
        state = torch.load(path, weights_only=True, map_location=where)
        moments = state["optimizer"]
        if self.sharded:
            moments = sharding.sharded_optimizer_state(moments, optimizer)
        optimizer.load_state_dict(moments)
        return int(state["step"])


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
    base = model_folder(source, s3=s3, workdir=workdir)
    full_checkpoint = checkpoint is not None and not lora
    weights = str(checkpoint) if full_checkpoint else base
    try:
        tokenizer = AutoTokenizer.from_pretrained(weights)
    except (OSError, ValueError) as error:
        raise ModelNotLoaded(f"model {weights}: {error}") from None
    model = _pretrained(weights, dtype, what="model")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if lora:
        model = _with_adapter(model, config, checkpoint)
    frozen = None
    if reference and not lora:
        starting = str(reference_checkpoint) if reference_checkpoint is not None else base
        frozen = frozen_copy(
            model if starting == weights else _pretrained(starting, dtype, what="reference model")
        )
    # Several processes share a fully fine-tuned model: its shards go to this process's GPU,
    # the whole model never does.
    if not lora and collective.world_size > 1:
        collective.join()
        bfloat16 = device.type == "cuda"
        model = sharding.shard(model, bfloat16=bfloat16)
        if frozen is not None:
            frozen = sharding.shard(frozen, bfloat16=bfloat16, keep_gathered=False)
    else:
        model.to(device)
        if frozen is not None:
            frozen.to(device)
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
