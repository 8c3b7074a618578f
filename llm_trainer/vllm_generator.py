"""Generation with vLLM (`grpo.generation: vllm`, LoRA runs; the trainer image carries vLLM): an
engine in the trainer's process serves the base model, and the adapter being trained is handed
over after each update as a new LoRA request — its folder written with PEFT, loaded by vLLM at
the next generate.

What it asks of vLLM's offline API (`LLM.generate` with token-id prompts and one
`SamplingParams` per prompt; vLLM's docs, "Offline inference" and the sampling parameters):
`logprobs=0`, which returns the sampled token's log-probability alone, under
`logprobs_mode="processed_logprobs"` — after temperature, `top_k` and `top_p`, the distribution it
sampled from, as the transformers generator's and the update's (logprobs.py); a seed per prompt (reproducible sampling). Unverified here (no GPU, no vLLM in the
tests, which drive this class with stand-ins for vLLM's objects): the engine on CUDA beside
training, and, with several trainer processes, vLLM under torchrun (`external_launcher`, as TRL
runs it).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.vllm import vllm_lora_rank
from llm_trainer.generation import (
    GenerationStopped,
    Sampled,
    SamplingSettings,
    Stop,
    never_stopped,
)
from training_configs.schema import TrainingConfig

# vLLM loads a LoRA adapter from a folder only (in-memory tensors are not in its API: the
# workaround of vllm-project/vllm#4068); a folder on a tmpfs is memory, so the hand-over never
# touches a disk. The trainer's pod mounts /dev/shm as a memory emptyDir
# (lambdas/kubernetes/training_job.py).
SHARED_MEMORY = Path("/dev/shm")


def handover_root(shared: Path = SHARED_MEMORY) -> str | None:
    """Where the adapters' folders go: shared memory where it is there and writable, else None
    (the system's temporary folder)."""
    return str(shared) if shared.is_dir() and os.access(shared, os.W_OK) else None


@dataclass(frozen=True)
class VllmApi:
    """The vLLM classes the generator builds requests with (stand-ins in the tests)."""

    sampling_params: Any
    tokens_prompt: Any
    lora_request: Any


def vllm_api() -> VllmApi:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    return VllmApi(SamplingParams, TokensPrompt, LoRARequest)


def start_engine(
    base: str,
    config: TrainingConfig,
    *,
    seed: int,
    processes: int,
    skip_tokenizer_init: bool = False,
) -> Any:
    """vLLM's offline engine on the base model, ready for the run's adapter (`skip_tokenizer_init`:
    without the model's tokenizer, token ids in and out — bench/gpu_check.py's random model)."""
    from vllm import LLM

    assert config.lora is not None  # the config refuses vllm without LoRA
    return LLM(
        model=base,
        enable_lora=True,
        max_lora_rank=vllm_lora_rank(config.lora.rank),
        max_loras=2,  # the adapter being served and the one replacing it
        max_model_len=config.max_length,
        gpu_memory_utilization=config.grpo.vllm_memory_share,
        dtype="bfloat16",
        seed=seed,
        logprobs_mode="processed_logprobs",
        skip_tokenizer_init=skip_tokenizer_init,
        **({"distributed_executor_backend": "external_launcher"} if processes > 1 else {}),
    )


class VllmGenerator:
    """A `Generator` (generation.py) on a vLLM engine serving the base model with the adapter
    the last `sync` wrote."""

    def __init__(self, engine: Any, api: VllmApi, *, adapters: Path) -> None:
        self.engine, self.api, self.adapters = engine, api, adapters
        self.lock = threading.Lock()
        self.version = 0  # adapters handed over so far
        self._adapter: Any = None

    def sync(self, model: Any) -> None:
        """Write the adapter of `model` (a PEFT model) and serve it from the next generate on;
        the folder before last is removed (the last may still be loading)."""
        self.version += 1
        folder = self.adapters / f"v{self.version}"
        model.save_pretrained(folder)
        self._adapter = self.api.lora_request(f"policy-v{self.version}", self.version, str(folder))
        shutil.rmtree(self.adapters / f"v{self.version - 2}", ignore_errors=True)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        settings: SamplingSettings,
        *,
        seed: int,
        stop: Stop = never_stopped,
    ) -> list[Sampled]:
        """`stop` is checked before generating: vLLM's batch runs to its end once started."""
        if not prompts:
            return []
        if stop():
            raise GenerationStopped("asked to stop before generating")
        if self._adapter is None:
            raise RuntimeError("no adapter to serve yet: sync the policy first")
        requests = [self.api.tokens_prompt(prompt_token_ids=list(prompt)) for prompt in prompts]
        params = [
            self.api.sampling_params(
                max_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k or -1,  # vLLM's "no cut" (0 also, in recent releases)
                logprobs=0,
                detokenize=False,  # the trainer decodes the token ids itself (service.py)
                seed=seed + index,
            )  # fmt: skip
            for index in range(len(prompts))
        ]
        outputs = self.engine.generate(requests, params, lora_request=self._adapter, use_tqdm=False)
        return [_sampled(output.outputs[0]) for output in outputs]


def _sampled(completion: Any) -> Sampled:
    """A vLLM completion: its token ids, each one's log-probability (`logprobs` holds, per
    position, a dict by token id that includes the sampled one), why it ended."""
    token_ids = list(completion.token_ids)
    logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, token_ids, strict=True)]  # fmt: skip
    reason = "length" if completion.finish_reason == "length" else "stop"
    return Sampled(token_ids, logprobs, reason)
