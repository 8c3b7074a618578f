"""Talking to an OpenEnv server (meta-pytorch/OpenEnv, `openenv/core/env_server/http_server.py`).

Its HTTP `/reset` and `/step` make a fresh environment per request, so a multi-turn episode
needs the WebSocket session protocol (`types.py`): on `/ws` each connection gets its own
environment; the client sends `{"type": "reset", "data": {"seed", "episode_id"}}`,
`{"type": "step", "data": <action>}` and `{"type": "close"}`; the server answers
`{"type": "observation", "data": {"observation": {...}, "reward": float | null, "done": bool,
"metadata"?: {...}}}` or `{"type": "error", "data": {"message", "code", "errors"?}}`.

Two session-less HTTP requests describe a server without taking one of its sessions: `GET
/schema` (the action's JSON schema: what a move looks like) and `POST /mcp` with JSON-RPC
`tools/list` (an MCP environment's tools, each `name`, `description` and its input schema, as
`input_schema` or MCP's `inputSchema`).
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request
import weakref
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

# OpenEnv's own client takes messages up to 100 MiB (openenv.core.env_client,
# `max_message_size_mb`); websockets' default is 1 MiB.
MAX_MESSAGE_BYTES = 100 * 1024 * 1024
_SURROGATE = re.compile("[\ud800-\udfff]")


class OpenEnvError(RuntimeError):
    """The OpenEnv server refused a message or could not be reached."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ActionRefused(OpenEnvError):
    """The server's action model refused the action (VALIDATION_ERROR): the model's bad move."""

    def __init__(self, message: str, errors: list[str]) -> None:
        super().__init__(message, "VALIDATION_ERROR")
        self.errors = errors


def session_url(url: str) -> str:
    """The WebSocket session endpoint of an OpenEnv server given by its base URL (http, https,
    ws or wss; a URL already ending in /ws is kept)."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"url {url!r}: give the OpenEnv server's http(s):// or ws(s):// address")
    path = parts.path.rstrip("/")
    path = path if path.endswith("/ws") else f"{path}/ws"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


def http_url(session: str, endpoint: str) -> str:
    """The server's HTTP `endpoint` (e.g. "/schema") beside its session endpoint `session`."""
    parts = urlsplit(session)
    scheme = {"ws": "http", "wss": "https"}[parts.scheme]
    return urlunsplit((scheme, parts.netloc, parts.path.removesuffix("/ws") + endpoint, "", ""))


def read_schema(session: str, timeout: float) -> dict[str, Any]:
    """The server's action schema (`GET /schema`'s `action`)."""
    answer = _http(http_url(session, "/schema"), None, timeout)
    action = answer.get("action") if isinstance(answer, dict) else None
    if not isinstance(action, dict):
        raise OpenEnvError(f"{http_url(session, '/schema')}: no action schema in the answer")
    return action


def list_tools(session: str, timeout: float) -> list[dict[str, Any]]:
    """An MCP environment's tools as OpenAI function definitions (`POST /mcp`, `tools/list`)."""
    where = http_url(session, "/mcp")
    asked = {"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 1}
    answer = _http(where, asked, timeout)
    error = answer.get("error") if isinstance(answer, dict) else None
    if error:
        message = error.get("message") if isinstance(error, dict) else error
        raise OpenEnvError(f"{where}: tools/list: {message}")
    result = answer.get("result") if isinstance(answer, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not isinstance(tools, list) or not tools:
        raise OpenEnvError(f"{where}: tools/list listed no tools")
    return [_function(tool) for tool in tools if isinstance(tool, dict)]


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    parameters = tool.get("input_schema") or tool.get("inputSchema") or {}
    function = {
        "name": str(tool.get("name")),
        "description": str(tool.get("description") or ""),
        "parameters": parameters if isinstance(parameters, dict) else {},
    }
    return {"type": "function", "function": function}


def _http(url: str, body: dict[str, Any] | None, timeout: float) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the configured server
            return json.load(response)
    except (OSError, urllib.error.URLError, json.JSONDecodeError) as error:
        raise OpenEnvError(f"{url}: {type(error).__name__}: {error}") from None


class Session:
    """One WebSocket session: one environment on the server."""

    def __init__(self, url: str, timeout: float) -> None:
        self._timeout = timeout
        try:
            # An episode's session outlives any one block: websockets' direct connection.
            self._socket: ClientConnection = connect(
                url, open_timeout=timeout, max_size=MAX_MESSAGE_BYTES, legacy=True
            )
        except (OSError, WebSocketException) as error:
            raise OpenEnvError(f"cannot open a session at {url}: {error}") from None
        self._closed = False
        weakref.finalize(self, self._socket.close)

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message and return the observation answering it."""
        try:
            # A server that cannot open the session (CAPACITY_REACHED) says so and closes before
            # reading anything: its answer is still there to read.
            with contextlib.suppress(ConnectionClosed):
                self._socket.send(_unicode(json.dumps(message, ensure_ascii=False)))
            raw = self._socket.recv(timeout=self._timeout)
            answer = json.loads(raw)
        except (OSError, TimeoutError, WebSocketException, json.JSONDecodeError) as error:
            raise OpenEnvError(f"{message['type']}: {type(error).__name__}: {error}") from None
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, dict):
            raise OpenEnvError(f"{message['type']}: not an OpenEnv answer: {str(raw)[:200]}")
        if answer.get("type") == "error":
            raise _refusal(message["type"], data)
        if answer.get("type") != "observation" or not isinstance(data.get("observation"), dict):
            raise OpenEnvError(
                f"{message['type']}: expected an observation, got {answer.get('type')!r}"
            )
        return data

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError, WebSocketException):
            self._socket.send(json.dumps({"type": "close"}))
        self._socket.close()


def _unicode(text: str) -> str:
    """`text` as valid Unicode: a lone surrogate (a model's reply may hold one; no server can
    encode it back) becomes U+FFFD, as a decoder shows bytes it cannot read."""
    return _SURROGATE.sub("\ufffd", text)


def _refusal(asked: str, data: dict[str, Any]) -> OpenEnvError:
    code, text, errors = data.get("code"), data.get("message"), data.get("errors")
    details = [_error_text(error) for error in errors] if isinstance(errors, list) else []
    if code == "VALIDATION_ERROR" and asked == "step":
        return ActionRefused(f"{asked}: {code}: {text}", details)
    shown = f"{asked}: {code}: {text}" + (f" ({'; '.join(details)})" if details else "")
    return OpenEnvError(shown, code if isinstance(code, str) else None)


def _error_text(error: Any) -> str:
    """One of a VALIDATION_ERROR's `errors` (pydantic's: `loc`, `msg`, `input`) as a line."""
    if not isinstance(error, dict):
        return str(error)
    where = ".".join(str(part) for part in error.get("loc", ()) if part != "data")
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))
