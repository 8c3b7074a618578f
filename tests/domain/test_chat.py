"""Chat messages (domain/chat.py) as the protocol carries them: exactly as given, tool calls
included, and refused where OpenAI's API would refuse them."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from domain.chat import ChatMessage
from domain.dataset import DatasetMessage
from domain.protocol import (
    ChatCompletionRequest,
    GenerateRequest,
    GenerateResponse,
    chat_completion,
    dump,
)

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": ""},
    {"role": "assistant", "content": None, "tool_calls": [CALL], "refusal": None},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}', "name": "f"},
    {"role": "assistant", "content": "done"},
]


def test_messages_dump_exactly_what_they_were_given() -> None:
    for message in CONVERSATION:
        assert ChatMessage.model_validate(message).model_dump(mode="json") == message
    request = GenerateRequest(sample_id="s", step_id="s_1", messages=CONVERSATION)
    assert json.loads(dump(request))["messages"] == CONVERSATION


def test_tools_travel_only_when_given() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    asked = ChatCompletionRequest.model_validate(
        {"messages": CONVERSATION, "tools": tools, "tool_choice": "auto"}
    )
    sent = GenerateRequest(
        sample_id="s", step_id="s_1", messages=asked.messages, tools=asked.tools,
        tool_choice=asked.tool_choice,
    )  # fmt: skip
    body = json.loads(dump(sent))
    assert body["tools"] == tools and body["tool_choice"] == "auto"
    plain = json.loads(dump(GenerateRequest(sample_id="s", step_id="s_1", messages=CONVERSATION)))
    assert "tools" not in plain and "tool_choice" not in plain


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ({"role": "user"}, "a user message needs content"),
        ({"role": "system", "content": None}, "a system message needs content"),
        ({"role": "assistant"}, "needs content or tool_calls"),
        ({"role": "assistant", "content": None, "tool_calls": []}, "must not be empty"),
        ({"role": "tool", "content": "x"}, "needs the tool_call_id"),
        ({"role": "tool", "tool_call_id": "c"}, "a tool message needs content"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}, "function"),
        (
            {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f"}}]},
            "needs arguments",
        ),
        ({"role": "robot", "content": "x"}, "role"),
    ],
)
def test_what_openai_refuses_is_refused(message: dict, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        ChatMessage.model_validate(message)


def test_datasets_ask_more_than_the_wire() -> None:
    """AWS's dataset validator wants text in system, user and tool messages; the wire takes ""."""
    assert ChatMessage.model_validate({"role": "user", "content": ""})
    with pytest.raises(ValidationError, match="needs non-empty content"):
        DatasetMessage.model_validate({"role": "user", "content": "  "})
    assert DatasetMessage.model_validate(CONVERSATION[2]).tool_calls[0].name == "f"


def test_a_tool_calling_answer_reaches_the_client_with_its_null_content() -> None:
    answer = GenerateResponse.model_validate(
        {
            "sample_id": "s",
            "step_id": "s_1",
            "data": {"choices": [{"message": {"role": "assistant", "content": None,
                                              "tool_calls": [CALL]}}]},
            "finish_reason": "tool_calls",
        }
    )  # fmt: skip
    completion = answer.completion()
    (choice,) = completion["choices"]
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [CALL]}
    assert choice["finish_reason"] == "tool_calls" and answer.content == ""
    shaped = chat_completion("s_1", completion, created=1.0, model="m")
    assert shaped["choices"][0]["message"]["content"] is None
    explicit = GenerateResponse.model_validate(
        {"sample_id": "s", "step_id": "s_1", "finish_reason": "stop",
         "data": {"choices": [{"message": {"content": "hi"}, "finish_reason": None,
                               "logprobs": None}]}}
    )  # fmt: skip
    (choice,) = chat_completion("s_1", explicit.completion(), created=1.0, model="m")["choices"]
    assert choice["finish_reason"] == "stop" and choice["message"] == {
        "role": "assistant",
        "content": "hi",
    }
