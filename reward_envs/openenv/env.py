"""An OpenEnv environment, served by its own server, as a reward environment.

One episode is one WebSocket session (protocol.py), closed however the episode ends: done, its
`max_turns` (which ends it here even when the server never does), a timeout or an error. OpenEnv
serves one session at a time unless the server is made with `max_concurrent_envs`: a server at
capacity answers CAPACITY_REACHED, and the episode waits for a session, within
`timeout_seconds`. `max_sessions` tells the conformance kit how many episodes the server takes
at once.

The model's turn becomes the server's action by `action_format`:
- `text`: its text as the one field `action_field` (OpenEnv's text environments take a
  `message`; a typed one, e.g. `action`);
- `json`: its text is the action, a JSON object (bare or in a ```json block);
- `tools`: an MCP environment (OpenEnv's `MCPEnvironment`): the model calls the server's tools
  (listed by `tools/list`) and each call is a `call_tool` step;
- `auto` (the default): read from the server's action schema (`/schema`): MCP's CallToolAction
  is `tools`, one text field is `text` with that field, anything else `json`; an `action_field`
  given means `text`.
A move the server cannot take — not JSON, refused by its action model (VALIDATION_ERROR), a
turn without a tool call, a call to an unknown tool or with bad arguments — is the model's bad
move: the turn scores 0, the model is shown why, and every step's info counts the episode's
such moves (domain/episodes.INVALID_METRIC). Only transport and server failures are errors: the
worker reports the rollout as `env_error`, never as a reward.

An observation is shown to the model as its `observation_field` (a dotted path, e.g.
`metadata.question`) or, by default, as JSON without its metadata; a tool call's answer is the
tool's result. A step's reward is the turn reward (none: 0; a turn's calls add up), `done` ends
the episode, and the observation's numeric metadata travels as metrics (openenv 0.10.0 nests it
in the observation and repeats it beside it; openenv-core 0.3.0 sends it beside it only).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal, get_args

from domain.episodes import INVALID_METRIC
from reward_envs.interface import (
    Environment,
    Episode,
    Message,
    Record,
    Reply,
    RewardRange,
    StepResult,
    ToolUse,
    tool_result,
)
from reward_envs.openenv.protocol import (
    ActionRefused,
    OpenEnvError,
    Session,
    list_tools,
    read_schema,
    session_url,
)

ActionFormat = Literal["auto", "text", "json", "tools"]
CAPACITY_POLL_SECONDS = 0.2
# The episode's moves the server could not take so far, in every step's info: the worker
# reports the last step's as env/invalid (domain/episodes.INVALID_METRIC), as Wordle's count.
INVALID_MOVES = INVALID_METRIC.removeprefix("env/")
# OpenEnv's ToolError types that are the model's call, not the server's failure (mcp_types.py).
_MODELS_TOOL_ERRORS = ("invalid_args", "tool_not_found", "execution_error")
_FENCED = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)


def action_format_of(schema: dict[str, Any]) -> tuple[ActionFormat, str | None]:
    """How a server whose action JSON schema is `schema` takes a move: (format, text field)."""
    properties = {
        name: _resolved(spec, schema)
        for name, spec in (schema.get("properties") or {}).items()
        if name != "metadata"  # every OpenEnv Action has it
    }
    if schema.get("title") == "CallToolAction" or {"tool_name", "arguments"} <= properties.keys():
        return "tools", None
    if len(properties) == 1:
        ((name, spec),) = properties.items()
        if spec.get("type") == "string":
            return "text", name
    return "json", None


def _resolved(spec: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """A property's schema, through a `$ref` to the schema's `$defs` (an Enum field's)."""
    if not isinstance(spec, dict):
        return {}
    reference = spec.get("$ref")
    if isinstance(reference, str) and reference.startswith("#/$defs/"):
        found = (schema.get("$defs") or {}).get(reference.removeprefix("#/$defs/"))
        return found if isinstance(found, dict) else {}
    return spec


class OpenEnvEpisode(Episode):
    def __init__(self, session: Session, environment: OpenEnvEnvironment) -> None:
        self._session = session
        self._environment = environment
        self._done = False
        self._turns = self._invalid = 0

    def step(self, reply: str) -> StepResult:
        return self.act(Reply.of(reply))

    def act(self, reply: Reply) -> StepResult:
        if self._done:
            return StepResult(messages=[], reward=0.0, done=True, info={"error": "episode is over"})
        self._turns += 1
        if self._environment.action_format == "tools":
            messages, reward, metadata = self._calls(reply.tool_calls)
        else:
            messages, reward, metadata = self._move(reply.content)
        # The server may never end an episode: its turn limit here is `max_turns`.
        if self._done or self._turns >= self._environment.max_turns:
            self.close()
        return StepResult(
            messages=messages,
            reward=reward,
            done=self._done,
            info={**_numbers(metadata), INVALID_MOVES: self._invalid},
        )

    def _move(self, text: str) -> tuple[list[Message], float, Any]:
        action, problem = self._environment.action_for(text)
        if action is None:
            return [self._refused(problem)], 0.0, None
        try:
            answer = self._ask(action)
        except ActionRefused as refused:
            return [self._refused("; ".join(refused.errors) or "not accepted")], 0.0, None
        return [self._environment.shown(answer["observation"])], _reward(answer), _metadata(answer)

    def _calls(self, calls: Sequence[ToolUse]) -> tuple[list[Message], float, Any]:
        if not calls:
            names = ", ".join(tool["function"]["name"] for tool in self._environment.tools)
            return [self._refused(f"no tool call; call one of: {names}")], 0.0, None
        messages: list[Message] = []
        reward, metadata = 0.0, None
        for call in calls:
            if self._done:  # an earlier call ended the episode: every call still gets its answer
                messages.append(tool_result(call, "error: the episode is over"))
                continue
            if call.problem is not None or call.arguments is None:
                self._invalid += 1
                messages.append(tool_result(call, f"error: {call.problem}"))
                continue
            asked = {"type": "call_tool", "tool_name": call.name, "arguments": call.arguments}
            try:
                answer = self._ask(asked)
            except ActionRefused as refused:
                self._invalid += 1
                messages.append(tool_result(call, f"error: {'; '.join(refused.errors)}"))
                continue
            messages.append(tool_result(call, self._tool_answer(call, answer["observation"])))
            reward += _reward(answer)
            metadata = _metadata(answer)
        return messages, reward, metadata

    def _tool_answer(self, call: ToolUse, observation: dict[str, Any]) -> str:
        """What the model reads of a call's observation: the tool's result, its error, or (an
        environment that answers a call with an observation of its own) the observation."""
        error = observation.get("error")
        if isinstance(error, dict):
            kind = error.get("error_type")
            if kind not in _MODELS_TOOL_ERRORS:  # transport_error, timeout: the server's failure
                self.close()
                raise OpenEnvError(f"call_tool {call.name}: {kind}: {error.get('message')}")
            if kind != "execution_error":  # the tool ran: a legal move that failed
                self._invalid += 1
            return f"error: {error.get('message')}"
        if "tool_name" in observation:
            return _tool_output(observation.get("result"))
        return self._environment.shown(observation)["content"] or ""

    def _ask(self, action: dict[str, Any]) -> dict[str, Any]:
        try:
            answer = self._session.ask({"type": "step", "data": action})
        except ActionRefused:
            raise
        except OpenEnvError:
            self.close()
            raise
        self._done = self._done or bool(answer.get("done"))
        return answer

    def _refused(self, why: str | None) -> Message:
        self._invalid += 1
        shown = f"Invalid action ({why}). {self._environment.action_hint}"
        return {"role": "user", "content": shown.strip()}

    def close(self) -> None:
        self._done = True
        self._session.close()


class OpenEnvEnvironment(Environment):
    """`url`: the OpenEnv server; `action_format` and `action_field`: how a turn becomes an
    action (module docstring); `observation_field`: what of an observation the model is shown;
    `max_sessions`: the server's `max_concurrent_envs` (OpenEnv's default: 1); `action_hint`:
    shown with a move the server could not take; `prompt`: the example records' task."""

    name = "openenv"

    def __init__(
        self,
        *,
        url: str,
        action_format: ActionFormat = "auto",
        action_field: str | None = None,
        observation_field: str | None = None,
        max_turns: int = 10,
        reward_low: float = 0.0,
        reward_high: float = 1.0,
        timeout_seconds: float = 60.0,
        max_sessions: int = 1,
        action_hint: str = "",
        prompt: str = "",
    ) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        if action_format not in get_args(ActionFormat):
            raise ValueError(
                f"action_format {action_format!r}: one of {', '.join(get_args(ActionFormat))}"
            )
        if action_field is not None and action_format not in ("auto", "text"):
            raise ValueError(f"action_field is for text actions, not action_format {action_format}")
        self.url = session_url(url)
        # Known from the arguments, or read from the server when first needed (_described).
        self._format: ActionFormat | None = None if action_format == "auto" else action_format
        self._field = action_field or ("message" if action_format == "text" else None)
        if action_field is not None:
            self._format = "text"
        # The action's fields, and its text field's choices, when read from /schema.
        self._fields: list[str] = []
        self._choices: list[str] = []
        self._tools: list[dict[str, Any]] | None = None
        self._describing = threading.Lock()
        self.observation_field = observation_field
        self.max_turns = max_turns
        self.reward_range = RewardRange(reward_low, reward_high)
        self.timeout_seconds = timeout_seconds
        self.concurrent_episodes = max_sessions
        self.action_hint = action_hint
        self.prompt = prompt

    @property
    def action_format(self) -> ActionFormat:
        return self._described()

    @property
    def action_field(self) -> str | None:
        self._described()
        return self._field

    @property
    def tools(self) -> list[dict[str, Any]]:  # type: ignore[override]
        self._described()
        return self._tools or []

    def _described(self) -> ActionFormat:
        """The action format, read from the server's schema once when `auto`; an MCP
        environment's tools listed once. Neither takes a session."""
        with self._describing:
            if self._format is None:
                schema = read_schema(self.url, self.timeout_seconds)
                self._format, self._field = action_format_of(schema)
                properties = schema.get("properties") or {}
                self._fields = [name for name in properties if name != "metadata"]
                choices = _resolved(properties.get(self._field), schema).get("enum")
                self._choices = [str(c) for c in choices] if isinstance(choices, list) else []
            if self._format == "tools" and self._tools is None:
                self._tools = list_tools(self.url, self.timeout_seconds)
            return self._format

    def action_for(self, text: str) -> tuple[dict[str, Any] | None, str | None]:
        """The action a turn's text is (text and json formats), or why it is none."""
        if self.action_format == "text":
            return {self._field or "message": text}, None
        body = text.strip()
        fenced = _FENCED.fullmatch(body)
        try:
            action = json.loads(fenced.group(1) if fenced else body)
        except json.JSONDecodeError as error:
            return None, f"not JSON: {error.msg}; a move is {self._wanted()}"
        if not isinstance(action, dict):
            return None, f"a move is {self._wanted()}"
        return action, None

    def _wanted(self) -> str:
        fields = f" with the fields {', '.join(self._fields)}" if self._fields else ""
        return f"a JSON object{fields}"

    def reset(self, record: Record, *, seed: int = 0) -> tuple[OpenEnvEpisode, list[Message]]:
        self._described()
        # OpenEnv's ResetRequest: a seed of at least 0, an episode id of at most 255 characters.
        asked = {"type": "reset", "data": {"seed": seed % 2**31, "episode_id": record.id[:255]}}
        session, answer = self._session_for(asked)
        prompt = record.metadata.get("prompt")
        parts = [
            prompt.strip() if isinstance(prompt, str) else "",
            self.shown(answer["observation"])["content"] or "",
        ]
        first: Message = {"role": "user", "content": "\n\n".join(part for part in parts if part)}
        return OpenEnvEpisode(session, self), [first]

    def _session_for(self, reset: dict[str, Any]) -> tuple[Session, dict[str, Any]]:
        """A new session and its reset's answer; a server at capacity is asked again until a
        session frees or `timeout_seconds` pass."""
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            session = Session(self.url, self.timeout_seconds)
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
        """Records whose prompt is `prompt`, or says how a move is made here; each episode's
        seed makes it differ (the server's reset takes it)."""
        prompt = self.prompt or self._how_to_move()
        return [
            Record(id=f"openenv-{seed}-{index}", metadata={"prompt": prompt})
            for index in range(count)
        ]

    def _how_to_move(self) -> str:
        format_ = self.action_format
        if format_ == "tools":
            return "Act with the tools you are given until the task is done."
        if format_ == "json":
            return f"Each reply is your move, {self._wanted()}, nothing else."
        choices = f": one of {', '.join(self._choices)}" if self._choices else ""
        return f"Each reply is your move (the action's {self.action_field}{choices}), nothing else."

    def shown(self, observation: dict[str, Any]) -> Message:
        """An observation as the user message the model reads ("" when it shows nothing)."""
        if self.observation_field is None:
            shown = {key: value for key, value in observation.items() if key != "metadata"}
            text = json.dumps(shown, sort_keys=True, ensure_ascii=False) if shown else ""
        else:
            value = _at(observation, self.observation_field)
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        return {"role": "user", "content": text}


def _at(observation: dict[str, Any], path: str) -> Any:
    """The observation's value at a dotted `path` ("" when it has none)."""
    value: Any = observation
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return ""
        value = value[part]
    return value


def _tool_output(result: Any) -> str:
    """An MCP tool result as text: its text content (FastMCP's CallToolResult), else its data."""
    if isinstance(result, dict):
        content = result.get("content")
        if isinstance(content, list):
            texts = [item.get("text") for item in content if isinstance(item, dict)]
            if texts and all(isinstance(text, str) for text in texts):
                return "\n".join(texts)
        if "data" in result:
            result = result["data"]
    return result if isinstance(result, str) else json.dumps(result, sort_keys=True)


def _reward(answer: dict[str, Any]) -> float:
    reward = answer.get("reward")
    return float(reward) if isinstance(reward, int | float) and math.isfinite(reward) else 0.0


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
    """The entry point: `url` (required), `action_format`, `action_field`, `observation_field`,
    `max_turns`, `reward_low`, `reward_high`, `timeout_seconds`, `max_sessions`, `action_hint`,
    `prompt` (a config's `environment_args`)."""
    if "url" not in kwargs:
        raise TypeError("openenv needs url: the OpenEnv server's address (environment_args.url)")
    return OpenEnvEnvironment(**kwargs)
