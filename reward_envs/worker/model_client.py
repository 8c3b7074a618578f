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
from typing import Any

from reward_envs.interface import Message, Reply


class ModelError(RuntimeError):
    """The model did not answer this turn (HTTP error, bad response)."""


class ModelTimeout(ModelError):
    """The model did not answer within the time left for the rollout."""


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
    ) -> Message:
        """The assistant's message answering `messages` (text, tool calls or both), within
        `timeout` seconds; `tools`: the OpenAI tool definitions the model may call."""


def assistant_message(completion: Any, step_id: str) -> Message:
    """`choices[0].message` of an OpenAI chat completion, as the server sent it."""
    try:
        message = completion["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as error:
        raise ModelError(f"{step_id}: completion has no choices[0].message") from error
    if not isinstance(message, dict) or not isinstance(message.get("content"), str | None):
        raise ModelError(f"{step_id}: choices[0].message is not an assistant message")
    return {**message, "role": "assistant"}


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
    ) -> Message:
        if self._delay:
            if self._delay > timeout:
                time.sleep(max(0.0, timeout))
                raise ModelTimeout(f"{step_id}: no reply within {timeout:.1f} s")
            time.sleep(self._delay)
        return Reply.of(self._reply(messages)).message


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
    ) -> Message:
        if timeout <= 0:
            raise ModelTimeout(f"{step_id}: no time left")
        request: dict[str, Any] = {
            "model": self._model,
            "messages": list(messages),
            "max_tokens": self._max_tokens,
            "user": sample_id,
        }
        if tools:
            request["tools"] = list(tools)
        body = json.dumps(request).encode()
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        request = urllib.request.Request(self._url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - configured URL
                payload = json.loads(response.read())
        except TimeoutError as error:
            raise ModelTimeout(f"{step_id}: no reply within {timeout:.1f} s") from error
        except urllib.error.HTTPError as error:
            raise ModelError(f"{step_id}: HTTP {error.code} from {self._url}") from error
        except urllib.error.URLError as error:
            if isinstance(error.reason, TimeoutError):
                raise ModelTimeout(f"{step_id}: no reply within {timeout:.1f} s") from error
            raise ModelError(f"{step_id}: cannot reach {self._url}: {error.reason}") from error
        except json.JSONDecodeError as error:
            raise ModelError(f"{step_id}: response is not JSON") from error
        return assistant_message(payload, step_id)
