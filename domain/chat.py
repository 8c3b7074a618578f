"""OpenAI chat messages, tool calls included: the one shape datasets, the rollout protocol, the
router and the environments share.

A message keeps exactly what it was given: `content: null` stays null, an absent field stays
absent, and fields this module does not know (`name`, `refusal`, ...) travel unchanged — so a
conversation goes from an environment through the proxy, the queues and the trainer and back
as the same JSON. The shape is OpenAI's chat completions API (`ChatCompletionMessageParam`,
`ChatCompletionMessageToolCall`): an assistant turn that calls tools has `tool_calls` (each
`{id, type: "function", function: {name, arguments}}`, `arguments` a JSON *text*, which a model
may get wrong) and may have `content: null`; a `tool` message answers one call by its
`tool_call_id`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

Role = Literal["system", "user", "assistant", "tool"]


class AsGiven(BaseModel):
    """A model that dumps the fields it was given, and only those (extra ones included)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = handler(self)
        given = self.model_fields_set | set(self.model_extra or {}) | self._always()
        return {key: value for key, value in dumped.items() if key in given}

    @classmethod
    def _always(cls) -> set[str]:
        """Fields dumped even when left at their default."""
        return set()


class ToolCall(AsGiven):
    """An OpenAI tool call in an assistant message."""

    id: str
    type: Literal["function"]
    function: dict[str, Any]

    @field_validator("function")
    @classmethod
    def _names_the_call(cls, function: dict[str, Any]) -> dict[str, Any]:
        missing = [key for key in ("name", "arguments") if key not in function]
        if missing:
            raise ValueError(f"needs {' and '.join(missing)}")
        return function

    @property
    def name(self) -> Any:
        return self.function["name"]

    @property
    def arguments(self) -> Any:
        """As the model wrote them: JSON text when it followed OpenAI's format."""
        return self.function["arguments"]


class ChatMessage(AsGiven):
    """One message of a conversation. What a message of its role must have, as OpenAI's API
    takes it: system and user messages have content; an assistant message has content or tool
    calls (content may then be null); a tool message names the call it answers."""

    role: Role
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _complete_for_its_role(self) -> ChatMessage:
        if self.role == "assistant":
            if self.content is None and self.tool_calls is None:
                raise ValueError("an assistant message needs content or tool_calls")
            if self.tool_calls == []:
                raise ValueError("an assistant message's tool_calls must not be empty")
        elif self.role == "tool":
            if self.tool_call_id is None:
                raise ValueError("a tool message needs the tool_call_id it answers")
            if self.content is None:
                raise ValueError("a tool message needs content")
        elif self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        return self

    @classmethod
    def _always(cls) -> set[str]:
        return {"role"}
