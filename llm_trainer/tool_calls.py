"""Tool calls in what an open-weights model wrote, as an OpenAI assistant message — in the format
the model's chat template teaches (`tool_format_of`), read as vLLM's tool parser for it reads it:

- `hermes` (Qwen2.5's and Qwen3's templates, and the default): each call a JSON object
  `{"name": …, "arguments": {…}}` between `<tool_call>` and `</tool_call>` (an unclosed last one
  runs to the end of the text), as vLLM's `hermes` parser reads it — the parser Qwen's team
  points vLLM users to (vllm/tool_parsers/hermes_tool_parser.py, Hermes2ProToolParser): the
  content is the text before the first tag (none when empty), each tag one call;
- `llama3_json` (Llama 3.1's template, which offers `<|python_tag|>`): bare JSON objects
  `{"name": …, "parameters": {…}}` (or `arguments`) anywhere in the text, as vLLM's
  `llama3_json` parser reads them (vllm/tool_parsers/llama_tool_parser.py,
  Llama3JsonToolParser): every `{` not inside an object already read starts one, the text around
  them is dropped (no content).

Either way the arguments go on as JSON text, and a call that is not such an object leaves the
whole reply as plain content (the environment then sees what the model wrote, and scores it).
Only a turn whose request offered tools is read for calls, as vLLM does.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

ToolFormat = Literal["hermes", "llama3_json"]
START = "<tool_call>"
CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1's marker of a tool call, in its chat template
# A call: its name and its arguments (any JSON value, sent on as JSON text).
Call = tuple[str, Any]
_MISSING = object()


def tool_format_of(chat_template: Any) -> ToolFormat:
    """The call format a tokenizer's chat template teaches (Hermes's unless it is Llama 3's)."""
    template = chat_template if isinstance(chat_template, str) else json.dumps(chat_template)
    if START not in template and PYTHON_TAG in template:
        return "llama3_json"
    return "hermes"


def assistant_message(
    text: str, *, tools_offered: bool, call_id: str, tool_format: ToolFormat = "hermes"
) -> dict[str, Any]:
    """The reply `text` as the assistant message the environment gets; `call_id` prefixes each
    call's id (`<call_id>_<n>`: unique in the conversation when `call_id` is the step's)."""
    plain = {"role": "assistant", "content": text}
    read = _hermes if tool_format == "hermes" else _llama3_json
    found = read(text) if tools_offered else None
    if found is None:
        return plain
    content, calls = found
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {
                "id": f"{call_id}_{number}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
            for number, (name, arguments) in enumerate(calls)
        ],
    }


def _hermes(text: str) -> tuple[str | None, list[Call]] | None:
    if START not in text:
        return None
    calls = []
    for match in CALL.finditer(text):
        try:
            call = json.loads((match.group(1) or match.group(2) or "").strip())
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        calls.append((call["name"], call.get("arguments", {})))
    return text[: text.index(START)] or None, calls


def _llama3_json(text: str) -> tuple[str | None, list[Call]] | None:
    decoder, calls, end = json.JSONDecoder(), [], -1
    for match in re.finditer(r"\{", text):
        start = match.start()
        # As vLLM: a brace at or before where the last object ended is skipped (so is one that
        # follows it at once).
        if start <= end:
            continue
        try:
            call, length = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            return None
        end = start + length
        arguments = call.get("arguments", call.get("parameters", _MISSING))
        if not isinstance(call.get("name"), str) or arguments is _MISSING:
            return None
        calls.append((call["name"], arguments))
    return (None, calls) if calls else None


def reply_text(
    tokenizer: Any, token_ids: list[int], *, tools_offered: bool, tool_format: ToolFormat = "hermes"
) -> str:
    """The sampled tokens as text, without the tokenizer's special tokens (the end of turn) —
    except Hermes's tool-call tags, which some tokenizers make special (vLLM's parser keeps them
    for the same reason; Llama's `<|python_tag|>` goes, its parser needs only the JSON)."""
    if not tools_offered or tool_format != "hermes":
        return str(tokenizer.decode(token_ids, skip_special_tokens=True))
    tags = (START, "</tool_call>")
    special = {
        token_id
        for token_id in tokenizer.all_special_ids
        if tokenizer.convert_ids_to_tokens(token_id) not in tags
    }
    kept = [token_id for token_id in token_ids if token_id not in special]
    return str(tokenizer.decode(kept, skip_special_tokens=False))
