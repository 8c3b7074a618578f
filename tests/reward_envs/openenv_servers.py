"""Real OpenEnv servers for the tests: environments written with OpenEnv's own framework
(`openenv` 0.10.0: `Environment`, `MCPEnvironment`, `Action`, `Observation`, `create_app`, and
FastMCP tools), each served by OpenEnv's own app, in one process on 127.0.0.1
(tests/loopback_server.py), each under its own path: `http://127.0.0.1:<port>/<kind>`.

- `echo`: text actions (`message`); answers the message back, ends the episode on "bye" with
  reward 1, puts the message's length in the observation's metadata; OpenEnv's default of one
  session;
- `endless`: the echo that never ends an episode;
- `guess`: guess a number from 1 to 10 (`seed % 10 + 1`) in four tries, `message` text, the
  hint (`higher`, `lower`, `correct`) as the observation's `hint`, reward 1 when right, the
  guesses so far in metadata; `"explode"` makes the environment raise;
- `grid`: a typed action, `{"action": "UP" | "DOWN" | "LEFT" | "RIGHT"}` (OpenEnv answers any
  other with VALIDATION_ERROR); the goal is two steps right: reward 1 and done;
- `walk`: the grid with a JSON action of two fields, `{"direction": ..., "steps": 1 | 2}`;
- `sums`: an MCP environment (FastMCP tools `add(a, b)` and `submit(answer)`); the reset's
  metadata asks "What is 17 + 25?"; `submit` ends the episode, reward 1 and `success` for "42".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from tests.loopback_server import loopback_server

ROOT = Path(__file__).parents[2]


class _Episodic(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any):
        self._state = State(episode_id=episode_id, step_count=0)
        return self.started(seed or 0)

    def started(self, seed: int) -> Observation:
        raise NotImplementedError

    @property
    def state(self) -> State:
        return self._state


class EchoAction(Action):
    message: str


class EchoObservation(Observation):
    echoed: str = ""


class EchoEnvironment(_Episodic):
    ends = True

    def started(self, seed: int) -> Observation:
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


class EndlessEnvironment(EchoEnvironment):
    ends = False


class HintObservation(Observation):
    hint: str = ""


class GuessEnvironment(_Episodic):
    def started(self, seed: int) -> Observation:
        self._target, self._guesses = seed % 10 + 1, 0
        return HintObservation(hint="Guess a number from 1 to 10.", metadata={"guesses": 0})

    def step(self, action: EchoAction, timeout_s: float | None = None, **_: Any):
        if action.message == "explode":
            raise RuntimeError("the environment blew up")
        self._guesses += 1
        try:
            guess = int(action.message.strip())
        except ValueError:
            hint = "not a number"
        else:
            hint = (
                "correct"
                if guess == self._target
                else "higher"
                if guess < self._target
                else "lower"
            )
        right = hint == "correct"
        return HintObservation(
            hint=hint,
            done=right or self._guesses >= 4,
            reward=1.0 if right else 0.0,
            metadata={"guesses": self._guesses},
        )


Direction = Literal["UP", "DOWN", "LEFT", "RIGHT"]
_MOVES = {"UP": (0, 1), "DOWN": (0, -1), "LEFT": (-1, 0), "RIGHT": (1, 0)}


class MoveAction(Action):
    action: Direction


class WalkAction(Action):
    direction: Direction
    steps: int = Field(ge=1, le=2)


class GridObservation(Observation):
    position: list[int] = [0, 0]
    goal: list[int] = [2, 0]


class GridEnvironment(_Episodic):
    def started(self, seed: int) -> Observation:
        self._at = [0, 0]
        return GridObservation(position=list(self._at))

    def step(self, action: MoveAction, timeout_s: float | None = None, **_: Any):
        return self.moved(action.action, 1)

    def moved(self, direction: str, steps: int) -> Observation:
        self._state.step_count += 1
        dx, dy = _MOVES[direction]
        self._at = [self._at[0] + dx * steps, self._at[1] + dy * steps]
        done = self._at == [2, 0]
        return GridObservation(position=list(self._at), done=done, reward=1.0 if done else 0.0)


class WalkEnvironment(GridEnvironment):
    def step(self, action: WalkAction, timeout_s: float | None = None, **_: Any):  # type: ignore[override]
        return self.moved(action.direction, action.steps)


class SumsEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        tools = FastMCP("sums")

        @tools.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @tools.tool
        def submit(answer: str) -> str:
            """Submit the final answer; ends the episode."""
            return answer

        super().__init__(tools)
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any):
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(metadata={"question": "What is 17 + 25?"})

    def _step_impl(self, action: Action, timeout_s: float | None = None, **_: Any):
        return Observation(metadata={"error": "call a tool"})

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any):
        # As OpenEnv's finqa_env ends an episode: the submitting call answers with the reward.
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            right = str(action.arguments.get("answer", "")).strip() == "42"
            return Observation(done=True, reward=1.0 if right else 0.0, metadata={"success": right})
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self) -> State:
        return self._state


Kind = Literal["echo", "endless", "guess", "grid", "walk", "sums"]
# kind: (environment, action, observation, max_concurrent_envs; None: OpenEnv's default of 1)
SERVED: dict[Kind, tuple[Any, Any, Any, int | None]] = {
    "echo": (EchoEnvironment, EchoAction, EchoObservation, None),
    "endless": (EndlessEnvironment, EchoAction, EchoObservation, 4),
    "guess": (GuessEnvironment, EchoAction, HintObservation, 8),
    "grid": (GridEnvironment, MoveAction, GridObservation, 4),
    "walk": (WalkEnvironment, WalkAction, GridObservation, 4),
    "sums": (SumsEnvironment, CallToolAction, CallToolObservation, 4),
}


def app() -> Any:
    """Every kind's own OpenEnv app under `/<kind>`, and `/health` for the start."""
    from fastapi import FastAPI

    served = FastAPI()
    served.get("/health")(lambda: {"status": "healthy"})
    for kind, (environment, action, observation, sessions) in SERVED.items():
        served.mount(
            f"/{kind}",
            create_app(
                environment, action, observation, env_name=kind, max_concurrent_envs=sessions
            ),
        )
    return served


@contextmanager
def openenv_servers(directory: Path) -> Iterator[dict[Kind, str]]:
    """Each kind's base URL (http://127.0.0.1:<port>/<kind>) while the block runs."""
    script = "from tests.reward_envs.openenv_servers import app\nserve(app())\n"
    with loopback_server(
        script, directory, kind="asgi", environment={"PYTHONPATH": str(ROOT)}
    ) as url:
        yield {kind: f"{url}/{kind}" for kind in SERVED}
