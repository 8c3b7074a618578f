"""What vLLM takes as a LoRA adapter's largest rank: `--max-lora-rank` is one of a few values
(vLLM's LoRA config, `MaxLoRARanks`; not an AWS contract). The trainer's engine and a SageMaker
endpoint serving an adapter both need it."""

from __future__ import annotations

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM takes that fits an adapter of `rank` (the config allows up to 512)."""
    return next(allowed for allowed in LORA_RANKS if allowed >= rank)
