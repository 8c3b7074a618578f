"""The open-weights trainer on one GPU in under ten minutes, nothing downloaded: a ~0.5 B
Qwen-architecture model (Qwen2.5-0.5B's shape) built from its config with random weights, the
tiny tokenizer (llm_trainer/tiny.py) for its chat template, and per measurement one line of
figures, all of them written as JSON:

- generation: tokens/s of the transformers generator and, where vLLM imports, of vLLM's engine
  (LoRA served, `skip_tokenizer_init`: token ids in and out) on the same prompts;
- update: seconds and peak GPU memory of a GRPO step (LoRA), with the log-probabilities chunked
  (`grpo.logprob_chunk_tokens`) and from the whole logits;
- hand-over: seconds to give the updated adapter to vLLM (`VllmGenerator.sync`) or, without
  vLLM, to write it as PEFT does;
- mismatch: the sampler's log-probabilities of what it sampled against the trainer's for the
  same tokens (k3 KL per token, |Δ| p50/p99/max) — vLLM's where it runs, else transformers'
  cached generation against the trainer's full forward pass.

Run on a GPU: `python -m bench.gpu_check [--out bench/results/gpu_check.json]`. Without CUDA,
or with `--reduced` (and under `BENCH_QUICK=1`, as `make test` runs every benchmark), the model
is a few thousand parameters and the batch small: it shows the script works, in seconds, and its
figures mean nothing. Nothing is asserted: it is a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.llm_trainer import timed
from llm_trainer.generation import SamplingSettings, TransformersGenerator
from llm_trainer.grpo import LossSettings, grpo_update, loss_settings, training_sequences
from llm_trainer.logprobs import next_token_scores, sampling_distribution
from llm_trainer.model import load_policy
from llm_trainer.tiny import tiny_tokenizer
from llm_trainer.tokens import SampledTurn, segments
from training_configs.schema import load_training_config

QUICK = os.environ.get("BENCH_QUICK") == "1"
# Qwen2.5-0.5B's shape (its config.json on the Hub), and a reduced one for a CPU.
FULL_SHAPE = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151_936}  # fmt: skip
REDUCED_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024}  # fmt: skip
PROMPT = [{"role": "user", "content": "Guess the five-letter word. Reply with one guess."}]


def build_model(folder: Path, shape: dict[str, int]) -> Path:
    """A Qwen2 model of `shape` with random weights (seeded) and the tiny tokenizer, saved."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(**shape, max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _once(work: Callable[[], Any]) -> tuple[float, Any]:
    return timed(work, rounds=1)


def _line(figures: dict[str, Any], name: str, **values: Any) -> None:
    figures[name] = values
    shown = ", ".join(
        f"{key} {value:,.4g}" if isinstance(value, float) else f"{key} {value}"
        for key, value in values.items()
    )
    print(f"{name}: {shown}", flush=True)


def _mismatch(sampler: list[float], trainer: list[float]) -> dict[str, float]:
    gaps = np.asarray(trainer) - np.asarray(sampler)
    return {"mismatch_kl": float(np.mean(np.expm1(gaps) - gaps)),
            "gap_p50": float(np.quantile(np.abs(gaps), 0.5)),
            "gap_p99": float(np.quantile(np.abs(gaps), 0.99)),
            "gap_max": float(np.abs(gaps).max())}  # fmt: skip


def _trainer_logprobs(policy: Any, prompt: list[int], sampled: Any, settings: LossSettings) -> list[float]:  # fmt: skip
    ids = torch.tensor([prompt + list(sampled.token_ids)], device=policy.device)
    with torch.no_grad(), policy.autocast():
        scores = next_token_scores(policy.model, ids, torch.ones_like(ids), settings.distribution)
    return scores.logprobs[0, len(prompt) - 1 :].float().cpu().tolist()


def _vllm(folder: Path, config: Any) -> Any:
    """vLLM's engine on the model, or None where it cannot run (no CUDA, not installed)."""
    if not torch.cuda.is_available():
        return None
    try:
        from llm_trainer.vllm_generator import VllmGenerator, start_engine, vllm_api
    except ImportError:
        return None
    try:
        engine = start_engine(str(folder), config, seed=0, processes=1, skip_tokenizer_init=True)
    except ImportError:
        return None
    return VllmGenerator(engine, vllm_api(), adapters=folder.parent / "adapters")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="the JSON (default: bench/results/gpu_check.json; a temporary file when reduced)")  # fmt: skip
    parser.add_argument("--reduced", action="store_true")
    options = parser.parse_args()
    reduced = options.reduced or QUICK or not torch.cuda.is_available()
    batch, new_tokens = (4, 8) if reduced else (64, 256)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        folder = build_model(Path(scratch) / "model", REDUCED_SHAPE if reduced else FULL_SHAPE)
        base = load_training_config("rft_multiturn_lora")
        config = base.model_validate({**base.model_dump(), "max_new_tokens": new_tokens,
                                      "max_length": 1024 + new_tokens})  # fmt: skip
        policy = load_policy(str(folder), config, s3=None, workdir=Path(scratch))
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        parameters = sum(p.numel() for p in policy.model.parameters())
        _line(figures, "setup", device=device, parameters=parameters, reduced=reduced,
              batch=batch, new_tokens=new_tokens)  # fmt: skip
        tokenizer, settings = policy.tokenizer, loss_settings(config)
        text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer.encode(text, add_special_tokens=False)
        sampling = SamplingSettings(new_tokens, **asdict(sampling_distribution(config)))
        generator = TransformersGenerator(policy.model, stop_token_ids=[],
                                          pad_token_id=tokenizer.pad_token_id, autocast=policy.autocast)  # fmt: skip
        seconds, sampled = _once(lambda: generator.generate([prompt] * batch, sampling, seed=0))
        tokens = sum(len(s.token_ids) for s in sampled)
        _line(
            figures, "transformers generation", tokens_per_second=tokens / seconds, seconds=seconds
        )
        engine = _vllm(folder, config)
        if engine is not None:
            engine.sync(policy.model)
            seconds, sampled = _once(lambda: engine.generate([prompt] * batch, sampling, seed=0))
            tokens = sum(len(s.token_ids) for s in sampled)
            _line(figures, "vllm generation", tokens_per_second=tokens / seconds, seconds=seconds)
        sampler = "vllm" if engine is not None else "transformers"
        trainer = [lp for s in sampled for lp in _trainer_logprobs(policy, prompt, s, settings)]
        behaviour = [lp for s in sampled for lp in s.logprobs]
        _line(figures, f"mismatch ({sampler} against the trainer)", tokens=len(behaviour),
              **_mismatch(behaviour, trainer))  # fmt: skip
        turns = [SampledTurn(0, tuple(prompt), tuple(s.token_ids), tuple(s.logprobs), "length", 0)
                 for s in sampled]  # fmt: skip
        sequences = training_sequences(
            [(1.0 if i % 2 else -1.0, segments([turn])) for i, turn in enumerate(turns)]
        )
        optimizer = policy.optimizer(1e-6)
        for label, chunk in (("chunked", settings.chunk_tokens), ("whole logits", None)):
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            seconds, stats = _once(lambda chunk=chunk: grpo_update(
                policy.model, optimizer, sequences, pad_id=tokenizer.pad_token_id,
                settings=LossSettings(distribution=settings.distribution, chunk_tokens=chunk),
                micro_batch_size=config.grpo.micro_batch_size, max_grad_norm=1.0,
                autocast=policy.autocast,
            ))  # fmt: skip
            peak = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
            _line(figures, f"GRPO step ({label})", seconds=seconds, peak_gb=peak,
                  grad_norm=stats.grad_norm)  # fmt: skip
        if engine is not None:
            seconds, _ = _once(lambda: engine.sync(policy.model))
            _line(figures, "hand-over (adapter to vLLM)", seconds=seconds)
        else:
            seconds, _ = _once(lambda: policy.model.save_pretrained(Path(scratch) / "adapter"))
            _line(figures, "hand-over (adapter written as PEFT does, no engine)", seconds=seconds)
        out = options.out or (Path(scratch) / "gpu_check.json" if reduced
                              else Path("bench/results/gpu_check.json"))  # fmt: skip
        out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"figures written to {out}")


if __name__ == "__main__":
    main()
