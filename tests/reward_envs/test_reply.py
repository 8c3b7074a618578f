"""The model's turn as an environment gets it (reward_envs/interface.py `Reply.of`): every tool
call parsed, or kept with the problem that makes it unusable."""

from __future__ import annotations

import json

import pytest

from reward_envs.interface import Reply, ToolUse, tool_result

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "act", "parameters": {"type": "object"}}},
]


def turn(*calls: object, content: object = None) -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def function(name: object, arguments: object, call_id: object = "c1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (function("lookup", '{"id": 7}'), ToolUse("c1", "lookup", {"id": 7}, '{"id": 7}')),
        (function("lookup", ""), ToolUse("c1", "lookup", {}, "")),  # no arguments: none needed
        (function("lookup", {"id": 7}), ToolUse("c1", "lookup", {"id": 7}, '{"id": 7}')),
        (
            function("lookup", "{id: 7"),
            ToolUse(
                "c1",
                "lookup",
                None,
                "{id: 7",
                "arguments are not JSON (Expecting property name enclosed in double quotes)",
            ),
        ),
        (
            function("lookup", "[7]"),
            ToolUse("c1", "lookup", None, "[7]", "arguments must be a JSON object"),
        ),
        (
            function("drop", "{}"),
            ToolUse("c1", "drop", None, "{}", "unknown tool 'drop' (tools: act, lookup)"),
        ),
        (function(None, "{}"), ToolUse("c1", "", None, "{}", "the call names no tool")),
        (function("", "{}"), ToolUse("c1", "", None, "{}", "the call names no tool")),
        (function("lookup", "{}", call_id=""), ToolUse("call_0", "lookup", {}, "{}")),
        (function("lookup", "{}", call_id=5), ToolUse("call_0", "lookup", {}, "{}")),
        ("not a call", ToolUse("call_0", "", None, "null", "the call names no tool")),
        (
            {"id": "c9", "function": "lookup"},
            ToolUse("c9", "", None, "null", "the call names no tool"),
        ),
    ],
)
def test_each_tool_call_is_parsed_or_kept_with_its_problem(call: object, expected: ToolUse) -> None:
    (use,) = Reply.of(turn(call), TOOLS).tool_calls
    assert use == expected


def test_a_turn_keeps_its_message_text_and_every_call_in_order() -> None:
    message = turn(function("lookup", "{}", "a"), function("act", "{}", "b"), content="Let me see.")
    reply = Reply.of(message, TOOLS)
    assert reply.message is message and reply.content == "Let me see."
    assert [use.id for use in reply.tool_calls] == ["a", "b"]
    assert Reply.of(turn(content=None), TOOLS).content == ""
    assert Reply.of({"role": "assistant", "content": None, "tool_calls": None}).tool_calls == ()
    text = Reply.of("[crane]")
    assert (text.content, text.tool_calls, text.message) == (
        "[crane]", (), {"role": "assistant", "content": "[crane]"},
    )  # fmt: skip
    (unknown,) = Reply.of(turn(function("lookup", "{}"))).tool_calls  # no tools declared
    assert unknown.problem == "unknown tool 'lookup' (tools: none)"


def test_a_tool_result_answers_its_call_by_id() -> None:
    use = ToolUse("c7", "lookup", {}, "{}")
    assert tool_result(use, {"b": 1, "a": [2]}) == {
        "role": "tool", "tool_call_id": "c7", "content": json.dumps({"a": [2], "b": 1}),
    }  # fmt: skip
    assert tool_result(use, "plain text")["content"] == "plain text"
