"""An OpenEnv environment, served by its own server, as a reward environment.

OpenEnv (meta-pytorch/OpenEnv) serves an environment over HTTP and WebSocket. Its HTTP `/reset`
and `/step` make a fresh environment per request, so a multi-turn episode needs its WebSocket
session protocol (`openenv/core/env_server/http_server.py`, `types.py`): on `/ws` each connection
gets its own environment; the client sends `{"type": "reset", "data": {"seed", "episode_id"}}`,
`{"type": "step", "data": <action>}` and `{"type": "close"}`; the server answers
`{"type": "observation", "data": {"observation": {...}, "reward": float | null, "done": bool,
"metadata"?: {...}}}` or `{"type": "error", "data": {"message", "code"}}`.

Here one episode is one session, closed however the episode ends: done, its `max_turns` (which
ends it here even when the server never does), a timeout or an error. OpenEnv serves one
session at a time unless the server is made with `max_concurrent_envs`: a server at capacity
answers CAPACITY_REACHED, and the episode waits for a session, within `timeout_seconds`.
`max_sessions` tells the conformance kit how many episodes the server takes at once.

The model's reply becomes the action `{action_field: reply}` (OpenEnv's text environments take a
`message`; a typed one, e.g. `action`). An action the server's model refuses (VALIDATION_ERROR)
is the model's move, and a bad one: the turn scores 0 and the model is shown why (the server's
`errors`), never an environment error. An observation is shown to the model as its
`observation_field` (or as JSON, without its metadata); a step's reward is the turn reward
(none: 0), `done` ends the episode, the observation's numeric metadata travels as metrics
(openenv 0.10.0 nests it in the observation and repeats it beside it; openenv-core 0.3.0 sends it
beside it only). Any other error the server answers with is raised: the worker reports the
rollout as `env_error`, never as a reward.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
import weakref
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.sync.client import ClientConnection, connect

from domain.episodes import INVALID_METRIC
from reward_envs.interface import Environment, Episode, Message, Record, RewardRange, StepResult

# OpenEnv's own client takes messages up to 100 MiB (openenv.core.env_client,
# `max_message_size_mb`); websockets' default is 1 MiB.
MAX_MESSAGE_BYTES = 100 * 1024 * 1024
CAPACITY_POLL_SECONDS = 0.2
_SURROGATE = re.compile("[\ud800-\udfff]")
# The episode's moves the server's action model refused so far, in every step's info: the worker
# reports the last step's as env/invalid (domain/episodes.INVALID_METRIC), as Wordle's count.
INVALID_MOVES = INVALID_METRIC.removeprefix("env/")


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


class _Session:
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
                self._socket.send(json.dumps(message))
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


class OpenEnvEpisode(Episode):
    def __init__(self, session: _Session, environment: OpenEnvEnvironment) -> None:
        self._session = session
        self._environment = environment
        self._done = False
        self._turns = self._invalid = 0

    def step(self, reply: str) -> StepResult:
        if self._done:
            return StepResult(messages=[], reward=0.0, done=True, info={"error": "episode is over"})
        self._turns += 1
        try:
            answer = self._session.ask(
                {"type": "step", "data": {self._environment.action_field: _unicode(reply)}}
            )
        except ActionRefused as refused:
            return self._refused_move(refused)
        except OpenEnvError:
            self.close()
            raise
        # The server may never end an episode: its turn limit here is `max_turns`.
        self._done = bool(answer.get("done")) or self._turns >= self._environment.max_turns
        if self._done:
            self.close()
        reward = answer.get("reward")
        return StepResult(
            messages=[self._environment.shown(answer["observation"])],
            reward=float(reward)
            if isinstance(reward, int | float) and math.isfinite(reward)
            else 0.0,
            done=self._done,
            info={**_numbers(_metadata(answer)), INVALID_MOVES: self._invalid},
        )

    def _refused_move(self, refused: ActionRefused) -> StepResult:
        self._invalid += 1
        self._done = self._turns >= self._environment.max_turns
        if self._done:
            self.close()
        why = "; ".join(refused.errors) or "the environment did not accept it"
        shown = f"Invalid action ({why}). {self._environment.action_hint}"
        return StepResult(
            messages=[{"role": "user", "content": shown.strip()}],
            reward=0.0,
            done=self._done,
            info={INVALID_MOVES: self._invalid},
        )

    def close(self) -> None:
        self._done = True
        self._session.close()


class OpenEnvEnvironment(Environment):
    """`url`: the OpenEnv server; `action_field`: the action's text field; `observation_field`:
    what of an observation the model is shown (default: all of it but its metadata, as JSON);
    `max_sessions`: the server's `max_concurrent_envs` (OpenEnv's default: 1)."""

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
        max_sessions: int = 1,
        action_hint: str = "",
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.url = session_url(url)
        self.action_field = action_field
        self.observation_field = observation_field
        self.max_turns = max_turns
        self.reward_range = RewardRange(reward_low, reward_high)
        self.timeout_seconds = timeout_seconds
        self.concurrent_episodes = max_sessions
        self.action_hint = action_hint

    def reset(self, record: Record, *, seed: int = 0) -> tuple[OpenEnvEpisode, list[Message]]:
        # OpenEnv's ResetRequest: a seed of at least 0, an episode id of at most 255 characters.
        asked = {"type": "reset", "data": {"seed": seed % 2**31, "episode_id": record.id[:255]}}
        session, answer = self._session_for(asked)
        first = self.shown(answer["observation"])
        prompt = record.metadata.get("prompt")
        if isinstance(prompt, str) and prompt.strip():
            first = {"role": "user", "content": f"{prompt.strip()}\n\n{first['content']}"}
        return OpenEnvEpisode(session, self), [first]

    def _session_for(self, reset: dict[str, Any]) -> tuple[_Session, dict[str, Any]]:
        """A new session and its reset's answer; a server at capacity is asked again until a
        session frees or `timeout_seconds` pass."""
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            session = _Session(self.url, self.timeout_seconds)
            try:
                return session, session.ask(reset)
            except OpenEnvError as refused:
                session.close()
                if refused.code != "CAPACITY_REACHED":
                    raise
                if time.monotonic() + CAPACITY_POLL_SECONDS > deadline:
                    raise OpenEnvError(
                        f"{refused} (waited {self.timeout_seconds:.0f} s for a session): the "
                        "server serves fewer sessions than episodes run at once; make it with "
                        "create_app(..., max_concurrent_envs=N) for N of at least the config's "
                        "rollout_concurrency times its reward_workers, and set max_sessions to N",
                        refused.code,
                    ) from None
            time.sleep(CAPACITY_POLL_SECONDS)  # a bounded poll: the deadline above ends it

    def example_records(self, count: int, *, seed: int = 0) -> list[Record]:
        return [Record(id=f"openenv-{seed}-{index}") for index in range(count)]

    def shown(self, observation: dict[str, Any]) -> Message:
        """An observation as the user message the model reads."""
        if self.observation_field is None:
            shown = {key: value for key, value in observation.items() if key != "metadata"}
            text = json.dumps(shown, sort_keys=True, ensure_ascii=False)
        else:
            value = observation.get(self.observation_field, "")
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        return {"role": "user", "content": text}


def _unicode(text: str) -> str:
    """`text` as valid Unicode: a lone surrogate (which no server can encode back) becomes
    U+FFFD, as a decoder shows bytes it cannot read."""
    return _SURROGATE.sub("\ufffd", text)


def _metadata(answer: dict[str, Any]) -> Any:
    """An observation's metadata, where the server's OpenEnv version puts it."""
    beside = answer.get("metadata")
    return beside if isinstance(beside, dict) else answer["observation"].get("metadata")


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
    `reward_low`, `reward_high`, `timeout_seconds`, `max_sessions`, `action_hint` (a config's
    `environment_args`)."""
    if "url" not in kwargs:
        raise TypeError("openenv needs url: the OpenEnv server's address (environment_args.url)")
    return OpenEnvEnvironment(**kwargs)
