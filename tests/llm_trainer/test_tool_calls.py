"""Tool calls in an open-weights model's reply: Hermes's `<tool_call>` format, read as vLLM's
`hermes` parser reads it (vllm/tool_parsers/hermes_tool_parser.py), and Llama 3.1's bare JSON,
as its `llama3_json` parser does, into the OpenAI assistant message the environment gets — the
format the model's chat template teaches, and through the generation service, from the sampled
tokens."""

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
from llm_trainer.tool_calls import assistant_message, reply_text, tool_format_of
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


def _answered(queues: dict[str, str], tokenizer: Any, reply: str) -> Any:
    """The generation service's answer to a turn offered TOOLS, the model writing `reply`; the
    sampled tokens beside it."""
    script = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
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
    return parse(GenerateResponse, answer["Body"]).data.choices[0], script


def test_the_service_answers_a_turn_that_calls_a_tool_with_its_call(
    queues: dict[str, str], tokenizer: Any
) -> None:
    choice, script = _answered(queues, tokenizer, LOOKUP)
    assert choice.finish_reason == "stop"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.id, call.name) == ("call_s_1_0", "lookup_order")
    assert json.loads(call.arguments) == {"order_id": "A-7"}
    # The tokens trained on are the ones sampled, whatever the message says.
    sampled = [int(t.token.removeprefix("token_id:")) for t in choice.logprobs["content"]]
    assert sampled == script


# Llama 3.1's format: bare JSON objects, read as vLLM's `llama3_json` parser reads them
# (vllm/tool_parsers/llama_tool_parser.py, Llama3JsonToolParser.extract_tool_calls).
WEATHER = '{"name": "weather", "parameters": {"city": "Oslo"}}'


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        (WEATHER, [("weather", '{"city": "Oslo"}')]),
        ('{"name": "weather", "arguments": {"city": "Oslo"}}', [("weather", '{"city": "Oslo"}')]),
        # Several, separated by semicolons; the text around them is dropped.
        (f"Sure: {WEATHER}; " + WEATHER.replace("Oslo", "Bergen") + " done",
         [("weather", '{"city": "Oslo"}'), ("weather", '{"city": "Bergen"}')]),
        # The object's own braces are not calls of their own.
        ('{"name": "f", "parameters": {"a": {"b": 1}}}', [("f", '{"a": {"b": 1}}')]),
        ('{"name": "f", "parameters": null}', [("f", "null")]),
    ],
)  # fmt: skip
def test_llama_calls_read_as_vllms_llama3_json_parser_reads_them(
    text: str, calls: list[tuple[str, str]]
) -> None:
    message = assistant_message(text, tools_offered=True, call_id="c", tool_format="llama3_json")
    assert message["content"] is None
    assert [
        (call["function"]["name"], call["function"]["arguments"]) for call in message["tool_calls"]
    ] == calls
    assert [call["id"] for call in message["tool_calls"]] == [f"c_{n}" for n in range(len(calls))]
    ChatMessage.model_validate(message)


@pytest.mark.parametrize(
    "text",
    [
        "The weather is fine.",  # no brace: no call
        '{"name": "weather"}',  # no arguments or parameters
        '{"parameters": {}}',  # no name
        '{"name": 5, "parameters": {}}',  # a name that is not text
        f"{WEATHER} and {{not json}}",  # one object that does not parse spoils the reply
        # Two with nothing between: vLLM skips the brace right where the first ended, then
        # reads the second's arguments as a call without a name.
        WEATHER + WEATHER,
    ],
)
def test_a_llama_reply_without_readable_calls_stays_what_the_model_wrote(text: str) -> None:
    message = assistant_message(text, tools_offered=True, call_id="c", tool_format="llama3_json")
    assert message == {"role": "assistant", "content": text}


LLAMA_TEMPLATE = (  # as Llama 3.1's: a tool call is `<|python_tag|>` and a JSON object
    "{%- if tools -%}Respond with a JSON for a function call: "
    '{"name": function name, "parameters": dictionary of argument name and its value}'
    "{%- endif -%}{%- for message in messages -%}"
    "{%- if message.tool_calls -%}<|python_tag|>{%- endif -%}{{ message['content'] }}"
    "{%- endfor -%}"
)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (tiny_tokenizer().chat_template, "hermes"),  # no calls taught: Hermes's, the default
        ("{%- if tools -%}<tool_call>{{ tool }}</tool_call>{%- endif -%}", "hermes"),
        (LLAMA_TEMPLATE, "llama3_json"),
        ({"default": LLAMA_TEMPLATE}, "llama3_json"),  # named templates: any of them
    ],
)
def test_the_format_is_the_one_the_chat_template_teaches(template: Any, expected: str) -> None:
    assert tool_format_of(template) == expected


def test_the_service_reads_a_llama_models_calls_in_its_format(queues: dict[str, str]) -> None:
    choice, _ = _answered(queues, tiny_tokenizer(chat_template=LLAMA_TEMPLATE), WEATHER)
    (call,) = choice.message.tool_calls
    assert (call.id, call.name) == ("call_s_1_0", "weather")
    assert json.loads(call.arguments) == {"city": "Oslo"}
