"""The open-weights trainer's own costs, for a model directory on whatever device is at hand (a
GPU when there is one; `--model tiny` on a CPU shows the script works): generation throughput,
the GRPO step and weight sync, each beside a named baseline run the same way.

- generation: sampled tokens per second of `TransformersGenerator` (which also takes every
  token's log-probability) against plain `model.generate` on the same prompts and seed;
- update: seconds per GRPO step (`grpo_update`: two passes' worth of bookkeeping, masked loss,
  clipped ratio) against one plain supervised step (cross-entropy on the same sequences);
- weight sync: seconds to hand the updated weights to generation (the same model object with
  transformers: nothing to copy); with `--lora`, also vLLM's handover (`VllmGenerator.sync`:
  the adapter written with PEFT for the engine to load, no engine here) against writing the
  adapter's tensors alone with safetensors;
- memory of the log-probabilities: the bytes one micro-batch's forward pass keeps for the
  backward pass (autograd's saved tensors, each storage once) with the head applied chunk by
  chunk (`grpo.logprob_chunk_tokens`, llm_trainer/logprobs.py) against the model's whole
  logits; on a GPU also the peak memory of a whole GRPO step each way.

Run: `python -m bench.llm_trainer --model DIR|HUB_ID|tiny [--batch 16] [--new-tokens 128]
[--rounds 3] [--lora]`. Nothing is asserted: it is a measurement. Prints the device, the
machine's core count and each figure with its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from llm_trainer.generation import SamplingSettings, TransformersGenerator
from llm_trainer.grpo import LossSettings, grpo_update, training_sequences
from llm_trainer.logprobs import DEFAULT_CHUNK_TOKENS, SamplingDistribution, next_token_scores
from llm_trainer.model import load_policy
from llm_trainer.tokens import SampledTurn, segments
from training_configs.schema import load_training_config

PROMPT = [{"role": "user", "content": "Write a short poem about the letter e, then explain it."}]


def timed(work, rounds: int) -> tuple[float, object]:
    """The median seconds of `rounds` runs of `work`, and its last result."""
    seconds, result = [], None
    for _ in range(rounds):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        result = work()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lora", action="store_true", help="RFT_MULTITURN_LORA (default: FULL)")
    options = parser.parse_args()
    config = load_training_config("rft_multiturn_lora" if options.lora else "rft_multiturn_full")
    with tempfile.TemporaryDirectory() as scratch:
        policy = load_policy(options.model, config, s3=None, workdir=Path(scratch))
    model, tokenizer = policy.model, policy.tokenizer
    text = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    prompts = [prompt] * options.batch
    generator = TransformersGenerator(
        model,
        stop_token_ids=[],
        pad_token_id=tokenizer.pad_token_id,  # never stop early
    )
    settings = SamplingSettings(max_new_tokens=options.new_tokens)
    ours, sampled = timed(lambda: generator.generate(prompts, settings, seed=0), options.rounds)
    ids = torch.tensor(prompts, device=policy.device)

    def plain() -> object:
        torch.manual_seed(0)
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  do_sample=True, max_new_tokens=options.new_tokens, min_new_tokens=options.new_tokens,
                                  pad_token_id=tokenizer.pad_token_id)  # fmt: skip

    baseline, _ = timed(plain, options.rounds)
    tokens = sum(len(s.token_ids) for s in sampled)
    turns = [
        SampledTurn(0, tuple(prompt), tuple(s.token_ids), tuple(s.logprobs), "length", 0)
        for s in sampled
    ]
    episodes = [(1.0 if i % 2 else -1.0, segments([turn])) for i, turn in enumerate(turns)]
    sequences = training_sequences(episodes)
    optimizer = policy.optimizer(1e-6)
    step, _ = timed(
        lambda: grpo_update(model, optimizer, sequences, pad_id=tokenizer.pad_token_id,
                            settings=LossSettings(), micro_batch_size=8, max_grad_norm=1.0),
        options.rounds,
    )  # fmt: skip
    batch = torch.tensor(
        [turn.prompt_ids + turn.completion_ids for turn in turns], device=policy.device
    )

    def supervised() -> object:
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(batch), 8):
            part = batch[start : start + 8]
            model(input_ids=part, labels=part).loss.backward()
        optimizer.step()
        return None

    sft, _ = timed(supervised, options.rounds)
    sync, _ = timed(lambda: generator.sync(model), options.rounds)
    memory = {
        label: _logprob_memory(model, optimizer, sequences, tokenizer.pad_token_id, chunk)
        for label, chunk in (("chunked", DEFAULT_CHUNK_TOKENS), ("whole", None))
    }
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    parameters = sum(p.numel() for p in model.parameters())
    print(f"model {options.model} ({parameters:,} parameters, {'LoRA' if options.lora else 'full'}) "
          f"on {device}, {os.cpu_count()} cores; batch {options.batch} x {options.new_tokens} new tokens")  # fmt: skip
    print(f"generation: {tokens / ours:,.0f} tokens/s (plain model.generate: {tokens / baseline:,.0f}; "
          f"ratio {baseline / ours:.2f})")  # fmt: skip
    print(
        f"GRPO step: {step:.3f} s (one supervised step on the same tokens: {sft:.3f} s; ratio {step / sft:.2f})"
    )
    print(f"weight sync: {sync * 1e3:.3f} ms (shared model object)")
    (kept, peak), (whole_kept, whole_peak) = memory["chunked"], memory["whole"]
    print(f"log-probabilities, kept for backward per micro-batch of 8: {kept / 1e6:.2f} MB chunked "
          f"by {DEFAULT_CHUNK_TOKENS} tokens (the whole logits: {whole_kept / 1e6:.2f} MB; ratio "
          f"{kept / whole_kept:.2f})")  # fmt: skip
    if peak is not None and whole_peak is not None:
        print(f"GRPO step peak GPU memory: {peak / 1e9:.2f} GB chunked (the whole logits: "
              f"{whole_peak / 1e9:.2f} GB; ratio {peak / whole_peak:.2f})")  # fmt: skip
    if options.lora:
        _adapter_handover(model, options.rounds)


def _logprob_memory(
    model: Any, optimizer: Any, sequences: list[Any], pad_id: int, chunk: int | None
) -> tuple[int, int | None]:
    """Bytes one micro-batch's forward keeps for the backward pass, and on a GPU the peak
    memory of a GRPO step, with the log-probabilities computed `chunk` tokens at a time."""
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    ids = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(s.segment.token_ids) for s in sequences[:8]], batch_first=True,
        padding_value=pad_id,
    ).to(next(model.parameters()).device)  # fmt: skip
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        next_token_scores(model, ids, torch.ones_like(ids), SamplingDistribution(),
                          entropy=True, chunk_tokens=chunk)  # fmt: skip
    if not torch.cuda.is_available():
        return sum(kept.values()), None
    torch.cuda.reset_peak_memory_stats()
    grpo_update(model, optimizer, sequences, pad_id=pad_id,
                settings=LossSettings(chunk_tokens=chunk), micro_batch_size=8, max_grad_norm=1.0)  # fmt: skip
    return sum(kept.values()), torch.cuda.max_memory_allocated()


def _adapter_handover(model: object, rounds: int) -> None:
    """vLLM's weight sync for a LoRA run: the adapter as PEFT writes it, against its tensors."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    from llm_trainer.vllm_generator import VllmApi, VllmGenerator

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        api = VllmApi(sampling_params=dict, tokens_prompt=dict, lora_request=lambda *a: a)
        generator = VllmGenerator(engine=None, api=api, adapters=folder / "adapters")
        handover, _ = timed(lambda: generator.sync(model), rounds)
        tensors = {k: v.detach().contiguous().cpu() for k, v in get_peft_model_state_dict(model).items()}  # fmt: skip
        raw, _ = timed(lambda: save_file(tensors, str(folder / "raw.safetensors")), rounds)
        size = (folder / "raw.safetensors").stat().st_size
    print(f"vLLM adapter handover: {handover * 1e3:.1f} ms for {size / 1e6:.1f} MB (the tensors "
          f"alone: {raw * 1e3:.1f} ms; ratio {handover / raw:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
