"""Tool calls in what an open-weights model wrote, as an OpenAI assistant message.

The format is Hermes's, which Qwen2.5's and Qwen3's chat templates teach: each call a JSON object
`{"name": …, "arguments": {…}}` between `<tool_call>` and `</tool_call>` (an unclosed last one
runs to the end of the text). It is read as vLLM's `hermes` tool parser reads it — the parser
Qwen's team points vLLM users to (vllm/tool_parsers/hermes_tool_parser.py, Hermes2ProToolParser):
the content is the text before the first tag (none when empty), each tag one call, the arguments
sent on as JSON text; a tag that does not hold such an object leaves the reply as plain content
(the environment then sees what the model wrote, and scores it).

Only a turn whose request offered tools is read for calls, as vLLM does.
"""

from __future__ import annotations

import json
import re
from typing import Any

START = "<tool_call>"
CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def assistant_message(text: str, *, tools_offered: bool, call_id: str) -> dict[str, Any]:
    """The reply `text` as the assistant message the environment gets; `call_id` prefixes each
    call's id (`<call_id>_<n>`: unique in the conversation when `call_id` is the step's)."""
    plain = {"role": "assistant", "content": text}
    if not tools_offered or START not in text:
        return plain
    calls = []
    for number, match in enumerate(CALL.finditer(text)):
        try:
            call = json.loads((match.group(1) or match.group(2) or "").strip())
        except json.JSONDecodeError:
            return plain
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return plain
        calls.append(
            {
                "id": f"{call_id}_{number}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False),
                },
            }
        )
    content = text[: text.index(START)]
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


def reply_text(tokenizer: Any, token_ids: list[int], *, tools_offered: bool) -> str:
    """The sampled tokens as text, without the tokenizer's special tokens (the end of turn) —
    except the tool-call tags, which some tokenizers make special (vLLM's parser keeps them for
    the same reason)."""
    if not tools_offered:
        return str(tokenizer.decode(token_ids, skip_special_tokens=True))
    tags = (START, "</tool_call>")
    special = {
        token_id
        for token_id in tokenizer.all_special_ids
        if tokenizer.convert_ids_to_tokens(token_id) not in tags
    }
    kept = [token_id for token_id in token_ids if token_id not in special]
    return str(tokenizer.decode(kept, skip_special_tokens=False))
