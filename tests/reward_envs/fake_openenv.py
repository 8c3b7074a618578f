"""An OpenEnv server speaking the WebSocket session protocol of meta-pytorch/OpenEnv
(`src/openenv/core/env_server/http_server.py` `/ws`, `types.py` WSResetMessage, WSStepMessage,
WSCloseMessage, WSObservationResponse, WSErrorResponse; `serialization.py`
serialize_observation), with one small environment: guess a number from 1 to 10, with hints.

The environment: the number is `seed % 10 + 1`; each step's action is `{"message": text}`
(anything else is refused as OpenEnv's pydantic actions refuse it: a VALIDATION_ERROR); the
observation says `higher`, `lower` or `correct`; reward 1.0 for the right number, else 0.0; the
episode ends when guessed or after four guesses; metadata counts the guesses. A message
`"explode"` makes the environment raise (an EXECUTION_ERROR answer). `max_sessions` bounds the
concurrent sessions as OpenEnv's ConcurrencyConfig does (CAPACITY_REACHED). For the client's
failure paths, a server that misbehaves: `"silent"` gets no answer, `"babble"` an answer that is
not JSON, `"state"` an answer of another type, `"nan"` a reward that is not a number.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve


class GuessingGame:
    def __init__(self) -> None:
        self.target = 0
        self.guesses = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> dict[str, Any]:
        self.target, self.guesses = (seed or 0) % 10 + 1, 0
        return self._observation("Guess a number from 1 to 10.", reward=None, done=False)

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        if set(action) != {"message"} or not isinstance(action["message"], str):
            raise ValueError("action: expected exactly {'message': str}")
        if action["message"] == "explode":
            raise RuntimeError("the environment blew up")
        self.guesses += 1
        try:
            guess = int(action["message"].strip())
        except ValueError:
            return self._observation("not a number", 0.0, self.guesses >= 4)
        if guess == self.target:
            return self._observation("correct", 1.0, True)
        hint = "higher" if guess < self.target else "lower"
        return self._observation(hint, 0.0, self.guesses >= 4)

    def _observation(self, hint: str, reward: float | None, done: bool) -> dict[str, Any]:
        return {
            "observation": {"hint": hint},
            "reward": reward,
            "done": done,
            "metadata": {"guesses": self.guesses},
        }


class FakeOpenEnv:
    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.sessions = 0
        self.opened = 0
        self.resets: list[dict[str, Any]] = []
        self.closed = 0  # sessions the client ended with a close message
        self._lock = threading.Lock()

    def handle(self, connection: ServerConnection) -> None:
        with self._lock:
            if self.sessions >= self.max_sessions:
                full = {"message": "capacity reached", "code": "CAPACITY_REACHED"}
                connection.send(json.dumps({"type": "error", "data": full}))
                return
            self.sessions += 1
            self.opened += 1
        game = GuessingGame()
        try:
            for raw in connection:
                message = json.loads(raw)
                kind = message.get("type")
                if kind == "close":
                    with self._lock:
                        self.closed += 1
                    return
                misbehaviour = (message.get("data") or {}).get("message")
                if kind == "step" and misbehaviour in ("silent", "babble", "state", "nan"):
                    if misbehaviour == "babble":
                        connection.send("<html>bad gateway</html>")
                    elif misbehaviour == "state":
                        connection.send(json.dumps({"type": "state", "data": {"step_count": 1}}))
                    elif misbehaviour == "nan":
                        observation = {"observation": {"hint": "?"}, "reward": float("nan")}
                        connection.send(json.dumps({"type": "observation", "data": observation}))
                    continue
                try:
                    if kind == "reset":
                        self.resets.append(message.get("data", {}))
                        data = game.reset(**message.get("data", {}))
                    elif kind == "step":
                        data = game.step(message["data"])
                    else:
                        raise LookupError(f"Unknown message type: {kind}")
                    answer = {"type": "observation", "data": data}
                except ValueError as invalid:
                    error = {"message": str(invalid), "code": "VALIDATION_ERROR"}
                    answer = {"type": "error", "data": error}
                except (RuntimeError, LookupError) as failed:
                    error = {"message": str(failed), "code": "EXECUTION_ERROR"}
                    answer = {"type": "error", "data": error}
                connection.send(json.dumps(answer))
        except ConnectionClosed:
            return
        finally:
            with self._lock:
                self.sessions -= 1


@contextmanager
def serving(max_sessions: int = 64) -> Iterator[tuple[str, FakeOpenEnv]]:
    """(base URL, server) on loopback; stopped on the way out."""
    fake = FakeOpenEnv(max_sessions)
    with serve(fake.handle, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        host, port = server.socket.getsockname()[:2]
        try:
            yield f"http://{host}:{port}", fake
        finally:
            server.shutdown()
            thread.join(timeout=5)
