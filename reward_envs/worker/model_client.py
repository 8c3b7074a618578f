"""How the worker asks the model for a turn: one small interface, several clients.

`OpenAICompatibleClient` talks to any OpenAI-style `/chat/completions` endpoint (vLLM, a local
server); the router's SigV4 proxy client implements the same interface; `CallableModel` wraps
a Python function (an instant model for benchmarks, a scripted one for tests, a solver).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from reward_envs.interface import Message, Reply


class ModelError(RuntimeError):
    """The model did not answer this turn (HTTP error, bad response)."""


class ModelTimeout(ModelError):
    """The model did not answer within the time left for the rollout."""


class PhaseClosed(ModelError):
    """The run's phase this rollout was asked for in has ended: its result is not wanted."""


@dataclass(frozen=True)
class ModelTurn:
    """The model's answer to one turn: the assistant message (what the conversation keeps), and
    what the trajectory store records of how it was made."""

    message: Message
    finish_reason: str | None = None  # "length": cut at the token limit (truncated)
    # How many updates the weights that answered had had, when the trainer says (our trainers
    # send `policy_version` beside the choices; Nova's does not).
    policy_version: int | None = None


class ModelClient(ABC):
    @abstractmethod
    def chat(
        self,
        messages: Sequence[Message],
        *,
        sample_id: str,
        step_id: str,
        timeout: float,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ModelTurn:
        """The assistant's message answering `messages` (text, tool calls or both), within
        `timeout` seconds; `tools`: the OpenAI tool definitions the model may call."""


def model_turn(completion: Any, step_id: str) -> ModelTurn:
    """`choices[0].message` of an OpenAI chat completion, as the server sent it, with the
    choice's `finish_reason` and the completion's `policy_version` when they are given."""
    try:
        choice = completion["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as error:
        raise ModelError(f"{step_id}: completion has no choices[0].message") from error
    if not isinstance(message, dict) or not isinstance(message.get("content"), str | None):
        raise ModelError(f"{step_id}: choices[0].message is not an assistant message")
    finish_reason = choice.get("finish_reason")
    version = completion.get("policy_version")
    return ModelTurn(
        {**message, "role": "assistant"},
        finish_reason if isinstance(finish_reason, str) else None,
        version if isinstance(version, int) and not isinstance(version, bool) else None,
    )


class CallableModel(ModelClient):
    """A model that is a Python function of the conversation (its text, or its whole message)."""

    def __init__(
        self, reply: Callable[[Sequence[Message]], str | Message], *, delay: float = 0.0
    ) -> None:
        self._reply = reply
        self._delay = delay

    def chat(
        self,
        messages: Sequence[Message],
        *,
        sample_id: str,
        step_id: str,
        timeout: float,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ModelTurn:
        if self._delay:
            if self._delay > timeout:
                time.sleep(max(0.0, timeout))
                raise ModelTimeout(f"{step_id}: no reply within {timeout:.1f} s")
            time.sleep(self._delay)
        return ModelTurn(Reply.of(self._reply(messages)).message)


class OpenAICompatibleClient(ModelClient):
    def __init__(
        self, base_url: str, model: str, *, api_key: str | None = None, max_tokens: int = 1024
    ) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._api_key = api_key
        self._max_tokens = max_tokens

    def chat(
        self,
        messages: Sequence[Message],
        *,
        sample_id: str,
        step_id: str,
        timeout: float,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ModelTurn:
        if timeout <= 0:
            raise ModelTimeout(f"{step_id}: no time left")
        body = chat_request(
            messages, tools, model=self._model, max_tokens=self._max_tokens, user=sample_id
        )
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(
            self._url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        _, payload = answer_of(request, timeout=timeout, what=step_id, server=self._url)
        return model_turn(payload, step_id)


def chat_request(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], **fields: Any
) -> dict[str, Any]:
    """An OpenAI chat request's body: the conversation, `fields`, and the tools if any."""
    body: dict[str, Any] = {"messages": list(messages), **fields}
    if tools:
        body["tools"] = list(tools)
    return body


def answer_of(
    request: urllib.request.Request, *, timeout: float, what: str, server: str
) -> tuple[int, Any]:
    """The status and JSON body of the answer to `request` within `timeout` seconds. No answer
    in time is ModelTimeout; 410 (the proxy's `phase_closed`) PhaseClosed; any other failure
    ModelError — each naming `what` was asked of which `server`, and the server's own message."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - configured URL
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        detail = _error_message(error.read())
        if error.code == HTTPStatus.GONE:
            raise PhaseClosed(f"{what}: {detail}") from error
        raise ModelError(f"{what}: HTTP {error.code} from {server}: {detail}") from error
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            raise ModelTimeout(f"{what}: no reply within {timeout:.1f} s") from error
        raise ModelError(f"{what}: cannot reach {server}: {error.reason}") from error
    except TimeoutError as error:
        raise ModelTimeout(f"{what}: no reply within {timeout:.1f} s") from error
    except json.JSONDecodeError as error:
        raise ModelError(f"{what}: the answer from {server} is not JSON") from error


def _error_message(raw: bytes) -> str:
    """An error answer's message: OpenAI's and the proxy's `error.message`, else its start."""
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw[:200].decode(errors="replace")
