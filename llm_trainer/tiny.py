"""A tiny causal language model built here, nothing downloaded: a byte-level tokenizer with a
few merges and a ChatML chat template, and a randomly initialised Llama-shaped model of a few
thousand parameters. It is what `--model tiny` trains and what the tests use: a real language
model behind the same code paths as a real one, only small enough for a CPU.

The merges make the tokenizer's encodings ambiguous on purpose: a reply sampled as `a`, `b`
decodes to "ab", which the tokenizer encodes as the single token `ab`. Re-tokenizing a
conversation is then wrong — exactly the mistake the trainer must not make (tokens.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY = "tiny"
PAD, START_OF_TURN, END_OF_TURN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK_MARKERS = ("<think>", "</think>")
# Merges of frequent pairs: several encodings of the same text exist.
MERGES = (("a", "b"), ("e", "r"), ("Ġ", "t"), ("t", "h"), ("i", "n"), ("[", "a"))

# ChatML (as Qwen's templates): every turn as `<|im_start|>role\ncontent<|im_end|>\n`.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
# As Qwen3's: the reasoning of assistant turns before the last user turn is dropped, so a
# later prompt does not start with the tokens of an earlier one.
THINK_STRIPPING_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- set content = message['content'] or '' -%}"
    "{%- if message['role'] == 'assistant' and loop.index0 < ns.last_user"
    " and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') -%}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)


def tiny_tokenizer(*, chat_template: str = CHAT_TEMPLATE) -> Any:
    """A byte-level BPE tokenizer: every byte a token, plus MERGES, the ChatML markers (special)
    and the reasoning markers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocabulary = {symbol: index for index, symbol in enumerate(alphabet)}
    for left, right in MERGES:
        vocabulary.setdefault(left + right, len(vocabulary))
    backend = Tokenizer(models.BPE(vocab=vocabulary, merges=list(MERGES)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=END_OF_TURN,
        pad_token=PAD,
        additional_special_tokens=[START_OF_TURN],
    )
    # Reasoning markers are tokens of their own but not special: a decoded reply keeps them.
    tokenizer.add_tokens(list(THINK_MARKERS))
    tokenizer.chat_template = chat_template
    return tokenizer


def tiny_model(tokenizer: Any, *, seed: int = 0) -> Any:
    """A 2-layer Llama of hidden size 32 over `tokenizer`'s vocabulary, weights from `seed`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_tiny(directory: Path, *, seed: int = 0, chat_template: str = CHAT_TEMPLATE) -> Path:
    """The tiny model and tokenizer saved as a model directory (`--model PATH` loads it)."""
    tokenizer = tiny_tokenizer(chat_template=chat_template)
    tiny_model(tokenizer, seed=seed).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
