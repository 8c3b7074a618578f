"""Real OpenEnv servers for the tests: environments written with OpenEnv's own framework
(`openenv` 0.10.0: `Environment`, `Action`, `Observation`, `create_app`), served as OpenEnv
serves them, on 127.0.0.1 in a process of their own (tests/loopback_server.py).

- `echo`: text actions (`message`); it answers the message back, ends the episode on "bye" with
  reward 1, and puts the message's length in the observation's metadata;
- `grid`: a typed action, `{"action": "UP" | "DOWN" | "LEFT" | "RIGHT"}` (OpenEnv answers any
  other with VALIDATION_ERROR); the goal is two steps right: reward 1 and done;
- `endless`: the echo that never ends an episode.

Each serves at OpenEnv's default of one session unless told `max_concurrent_envs`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from tests.loopback_server import loopback_server

ROOT = Path(__file__).parents[2]


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed: str = ""


class EchoEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    ends = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any):
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed="say something (bye ends it)")

    def step(self, action: EchoAction, timeout_s: float | None = None, **_: Any):
        self._state.step_count += 1
        done = self.ends and "bye" in action.message.lower()
        return EchoObservation(
            echoed=action.message,
            done=done,
            reward=1.0 if done else 0.0,
            metadata={"length": len(action.message)},
        )

    @property
    def state(self) -> State:
        return self._state


class EndlessEnvironment(EchoEnvironment):
    ends = False


class MoveAction(Action):
    action: Literal["UP", "DOWN", "LEFT", "RIGHT"]


class GridObservation(Observation):
    position: list[int] = [0, 0]
    goal: list[int] = [2, 0]


class GridEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    _MOVES = {"UP": (0, 1), "DOWN": (0, -1), "LEFT": (-1, 0), "RIGHT": (1, 0)}

    def __init__(self) -> None:
        super().__init__()
        self._state, self._at = State(), [0, 0]

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any):
        self._state, self._at = State(episode_id=episode_id, step_count=0), [0, 0]
        return GridObservation(position=list(self._at))

    def step(self, action: MoveAction, timeout_s: float | None = None, **_: Any):
        self._state.step_count += 1
        dx, dy = self._MOVES[action.action]
        self._at = [self._at[0] + dx, self._at[1] + dy]
        done = self._at == [2, 0]
        return GridObservation(position=list(self._at), done=done, reward=1.0 if done else 0.0)

    @property
    def state(self) -> State:
        return self._state


SERVED = {
    "echo": (EchoEnvironment, EchoAction, EchoObservation),
    "endless": (EndlessEnvironment, EchoAction, EchoObservation),
    "grid": (GridEnvironment, MoveAction, GridObservation),
}
Kind = Literal["echo", "endless", "grid"]


def app(kind: Kind, max_concurrent_envs: int | None) -> Any:
    environment, action, observation = SERVED[kind]
    return create_app(
        environment, action, observation, env_name=kind, max_concurrent_envs=max_concurrent_envs
    )


@contextmanager
def openenv_server(
    kind: Kind, directory: Path, *, max_concurrent_envs: int | None = None
) -> Iterator[str]:
    """The server's base URL (http://127.0.0.1:<port>) while the block runs."""
    script = (
        "from tests.reward_envs.openenv_servers import app\n"
        f"serve(app({kind!r}, {max_concurrent_envs!r}))\n"
    )
    with loopback_server(
        script, directory, kind="asgi", environment={"PYTHONPATH": str(ROOT)}
    ) as url:
        yield url
