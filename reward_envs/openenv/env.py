"""An OpenEnv environment, served by its own server, as a reward environment.

OpenEnv (meta-pytorch/OpenEnv) serves an environment over HTTP and WebSocket. Its HTTP `/reset`
and `/step` make a fresh environment per request, so a multi-turn episode needs its WebSocket
session protocol (`openenv/core/env_server/http_server.py`, `types.py`): on `/ws` each connection
gets its own environment; the client sends `{"type": "reset", "data": {"seed", "episode_id"}}`,
`{"type": "step", "data": <action>}` and `{"type": "close"}`; the server answers
`{"type": "observation", "data": {"observation": {...}, "reward": float | null, "done": bool,
"metadata"?: {...}}}` or `{"type": "error", "data": {"message", "code"}}`.

Here one episode is one session. The model's reply becomes the action `{action_field: reply}`
(OpenEnv's text environments take a `message`); an observation is shown to the model as its
`observation_field` (or as JSON); a step's reward is the turn reward (none: 0), `done` ends the
episode, the observation's numeric metadata travels as metrics. An error the server answers
with is raised: the worker reports the rollout as `env_error`, never as a reward.
"""

from __future__ import annotations

import contextlib
import json
import math
import weakref
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

from reward_envs.interface import Environment, Episode, Message, Record, RewardRange, StepResult


class OpenEnvError(RuntimeError):
    """The OpenEnv server refused a message or could not be reached."""


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


class _Session:
    """One WebSocket session: one environment on the server."""

    def __init__(self, url: str, timeout: float) -> None:
        self._timeout = timeout
        try:
            # An episode's session outlives any one block: websockets' direct connection.
            self._socket: ClientConnection = connect(url, open_timeout=timeout, legacy=True)
        except (OSError, WebSocketException) as error:
            raise OpenEnvError(f"cannot open a session at {url}: {error}") from None
        weakref.finalize(self, self._socket.close)

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message and return the observation answering it."""
        try:
            # A server that cannot open the session (CAPACITY_REACHED) says so and closes before
            # reading anything: its answer is still there to read.
            with contextlib.suppress(ConnectionClosed):
                self._socket.send(json.dumps(message))
            raw = self._socket.recv(timeout=self._timeout)
            answer = json.loads(raw)
        except (OSError, TimeoutError, WebSocketException, json.JSONDecodeError) as error:
            raise OpenEnvError(f"{message['type']}: {type(error).__name__}: {error}") from None
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, dict):
            raise OpenEnvError(f"{message['type']}: not an OpenEnv answer: {str(raw)[:200]}")
        if answer.get("type") == "error":
            raise OpenEnvError(f"{message['type']}: {data.get('code')}: {data.get('message')}")
        if answer.get("type") != "observation" or not isinstance(data.get("observation"), dict):
            raise OpenEnvError(
                f"{message['type']}: expected an observation, got {answer.get('type')!r}"
            )
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError, WebSocketException):
            self._socket.send(json.dumps({"type": "close"}))
        self._socket.close()


class OpenEnvEpisode(Episode):
    def __init__(self, session: _Session, environment: OpenEnvEnvironment) -> None:
        self._session = session
        self._environment = environment
        self._done = False

    def step(self, reply: str) -> StepResult:
        if self._done:
            return StepResult(messages=[], reward=0.0, done=True, info={"error": "episode is over"})
        answer = self._session.ask(
            {"type": "step", "data": {self._environment.action_field: reply}}
        )
        self._done = bool(answer.get("done"))
        if self._done:
            self._session.close()
        reward = answer.get("reward")
        return StepResult(
            messages=[self._environment.shown(answer["observation"])],
            reward=float(reward)
            if isinstance(reward, int | float) and math.isfinite(reward)
            else 0.0,
            done=self._done,
            info=_numbers(answer.get("metadata")),
        )


class OpenEnvEnvironment(Environment):
    """`url`: the OpenEnv server; `action_field`: the action's text field; `observation_field`:
    what of an observation the model is shown (default: all of it, as JSON)."""

    name = "openenv"

    def __init__(
        self,
        *,
        url: str,
        action_field: str = "message",
        observation_field: str | None = None,
        max_turns: int = 10,
        reward_low: float = 0.0,
        reward_high: float = 1.0,
        timeout_seconds: float = 60.0,
    ) -> None:
        self.url = session_url(url)
        self.action_field = action_field
        self.observation_field = observation_field
        self.max_turns = max_turns
        self.reward_range = RewardRange(reward_low, reward_high)
        self.timeout_seconds = timeout_seconds

    def reset(self, record: Record, *, seed: int = 0) -> tuple[OpenEnvEpisode, list[Message]]:
        session = _Session(self.url, self.timeout_seconds)
        # OpenEnv's ResetRequest: a seed of at least 0, an episode id of at most 255 characters.
        answer = session.ask(
            {"type": "reset", "data": {"seed": seed % 2**31, "episode_id": record.id[:255]}}
        )
        first = self.shown(answer["observation"])
        prompt = record.metadata.get("prompt")
        if isinstance(prompt, str) and prompt.strip():
            first = {"role": "user", "content": f"{prompt.strip()}\n\n{first['content']}"}
        return OpenEnvEpisode(session, self), [first]

    def example_records(self, count: int, *, seed: int = 0) -> list[Record]:
        return [Record(id=f"openenv-{seed}-{index}") for index in range(count)]

    def shown(self, observation: dict[str, Any]) -> Message:
        """An observation as the user message the model reads."""
        if self.observation_field is None:
            text = json.dumps(observation, sort_keys=True, ensure_ascii=False)
        else:
            value = observation.get(self.observation_field, "")
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        return {"role": "user", "content": text}


def _numbers(metadata: Any) -> dict[str, Any]:
    if not isinstance(metadata, dict):
        return {}
    return {
        key: value
        for key, value in metadata.items()
        if isinstance(value, bool | int | float)
        and (isinstance(value, bool) or math.isfinite(value))
    }


def load_environment(**kwargs: Any) -> OpenEnvEnvironment:
    """The entry point: `url` (required), `action_field`, `observation_field`, `max_turns`,
    `reward_low`, `reward_high`, `timeout_seconds` (a config's `environment_args`)."""
    if "url" not in kwargs:
        raise TypeError("openenv needs url: the OpenEnv server's address (environment_args.url)")
    return OpenEnvEnvironment(**kwargs)
