"""Tool calls in an open-weights model's reply: Hermes's `<tool_call>` format, read as vLLM's
`hermes` parser reads it (vllm/tool_parsers/hermes_tool_parser.py), into the OpenAI assistant
message the environment gets — and through the generation service, from the sampled tokens."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from domain.chat import ChatMessage
from domain.protocol import GenerateRequest, GenerateResponse, dump, parse
from domain.run_queues import QueueKind
from llm_trainer.service import GenerationService
from llm_trainer.tiny import tiny_tokenizer
from llm_trainer.tool_calls import assistant_message, reply_text
from tests.llm_trainer.fakes import ScriptedGenerator
from tests.llm_trainer.test_service import job_for, received, send

LOOKUP = '<tool_call>\n{"name": "lookup_order", "arguments": {"order_id": "A-7"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "lookup_order", "parameters": {}}}]


def test_a_reply_with_calls_is_an_assistant_message_with_tool_calls() -> None:
    text = f"Let me check.\n{LOOKUP}\n" + LOOKUP.replace("A-7", "B-8")
    message = assistant_message(text, tools_offered=True, call_id="call_s_2")
    assert message == {
        "role": "assistant",
        "content": "Let me check.\n",
        "tool_calls": [
            {"id": "call_s_2_0", "type": "function", "function": {
                "name": "lookup_order", "arguments": '{"order_id": "A-7"}'}},
            {"id": "call_s_2_1", "type": "function", "function": {
                "name": "lookup_order", "arguments": '{"order_id": "B-8"}'}},
        ],
    }  # fmt: skip
    ChatMessage.model_validate(message)  # what the protocol and the environments take


@pytest.mark.parametrize(
    ("text", "expected_content", "arguments"),
    [
        (LOOKUP, None, '{"order_id": "A-7"}'),  # nothing before the call: no content
        # Cut at the token limit inside the closing tag: the open call runs to the end.
        ('<tool_call>{"name": "lookup_order", "arguments": {"order_id": "é"}}', None,
         '{"order_id": "é"}'),
        ('<tool_call>{"name": "lookup_order"}</tool_call>', None, "{}"),
    ],
)  # fmt: skip
def test_the_calls_read_as_vllms_hermes_parser_reads_them(
    text: str, expected_content: str | None, arguments: str
) -> None:
    message = assistant_message(text, tools_offered=True, call_id="c")
    assert message["content"] == expected_content
    assert [call["function"]["arguments"] for call in message["tool_calls"]] == [arguments]


@pytest.mark.parametrize(
    ("text", "tools_offered"),
    [
        (LOOKUP, False),  # no tools offered: nothing is read as a call
        ("I would call <tool_call>{not json}</tool_call>", True),
        ('<tool_call>["lookup_order"]</tool_call>', True),
        ('<tool_call>{"arguments": {}}</tool_call>', True),
        ("No call here.", True),
    ],
)
def test_a_reply_without_a_readable_call_stays_what_the_model_wrote(
    text: str, tools_offered: bool
) -> None:
    assert assistant_message(text, tools_offered=tools_offered, call_id="c") == {
        "role": "assistant", "content": text,
    }  # fmt: skip


def test_tags_a_tokenizer_makes_special_are_kept_and_the_end_of_turn_is_not() -> None:
    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    ids = tokenizer.encode(LOOKUP, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids  # one special token
    assert reply_text(tokenizer, ids, tools_offered=True) == LOOKUP
    # Without tools, every special token goes: the text is what lies between the tags.
    inner = LOOKUP.removeprefix("<tool_call>").removesuffix("</tool_call>")
    assert reply_text(tokenizer, ids, tools_offered=False) == inner


def test_the_service_answers_a_turn_that_calls_a_tool_with_its_call(
    queues: dict[str, str], tokenizer: Any
) -> None:
    script = tokenizer.encode(LOOKUP, add_special_tokens=False) + [tokenizer.eos_token_id]
    generator = ScriptedGenerator([script], stop_token_id=tokenizer.eos_token_id)
    service = GenerationService(
        job_for(queues, max_new_tokens=len(script)), sqs=boto3.client("sqs"),
        tokenizer=tokenizer, generator=generator,
    )  # fmt: skip
    request = GenerateRequest(
        sample_id="s", step_id="s_1", tools=TOOLS,
        messages=[{"role": "user", "content": "Where is order A-7?"}],
    )  # fmt: skip
    send(queues, dump(request), "s_1")
    service.answer(received(queues, QueueKind.GENERATE_REQUESTS))
    [answer] = received(queues, QueueKind.GENERATE_RESPONSES)
    choice = parse(GenerateResponse, answer["Body"]).data.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.id, call.name) == ("call_s_1_0", "lookup_order")
    assert json.loads(call.arguments) == {"order_id": "A-7"}
    # The tokens trained on are the ones sampled, whatever the message says.
    sampled = [int(t.token.removeprefix("token_id:")) for t in choice.logprobs["content"]]
    assert sampled == script
