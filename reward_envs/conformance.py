"""The conformance kit: does an environment keep the interface's promises?

`mtrl env check SPEC` runs it and prints the table; in your own tests:

    from reward_envs.conformance import check_environment
    report = check_environment(load_environment())
    assert report.passed, report.summary()

Every check plays real episodes with the environment's `example_reply` (or the given records)
and reports the first thing that went wrong, with the record, the turn and the reply.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sysconfig
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from reward_envs.interface import (
    Environment,
    Episode,
    Message,
    Record,
    Reply,
    RewardRange,
    StepResult,
    close_quietly,
    closed_after,
    tool_turn,
)

ROLES = {"system", "user", "assistant", "tool"}
GARBAGE_REPLIES = (
    "",
    " \n\t ",
    "x" * 1_000_000,
    "\x00\x01\x1b[31m\udc80\ufffd\U0010ffff",
    '{"guess": null, "answer": [1, 2, 3]}',
    "[[[[ ]]]] <think> unterminated",
    "😀" * 500,
)


def garbage_tool_turns(tools: Sequence[Any]) -> list[Message]:
    """Assistant turns whose tool calls no tool can run: an unknown tool, no name, arguments
    that are not JSON or not an object, and for the environment's first tool, arguments of the
    wrong type or none at all."""

    def call(name: Any, arguments: Any, content: str | None = None) -> Message:
        return tool_turn(name, arguments, call_id="call_garbage", content=content)

    turns = [
        call("no_such_tool", "{}"),
        call(None, "{}"),
        call("", "{}", content="thinking..."),
        {"role": "assistant", "content": None, "tool_calls": "not a list"},
        {"role": "assistant", "content": None, "tool_calls": [None, 7]},
    ]
    names = [tool.get("function", {}).get("name") for tool in tools if isinstance(tool, dict)]
    if names:
        first = names[0]
        turns += [
            call(first, "{not json"),
            call(first, "[1, 2, 3]"),
            call(first, '{"unexpected": [null, {"deep": true}]}'),
            call(first, "{}"),
            call(first, json.dumps({"x": "y" * 100_000})),
        ]
    return turns


class ConformanceError(AssertionError):
    """One broken promise, described for the environment's author."""


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str


@dataclass
class Transcript:
    """Everything observable in one episode, for comparing runs."""

    first: list[Message]
    steps: list[tuple[str | Message, list[Message], float, bool]] = field(default_factory=list)

    @property
    def turn_rewards(self) -> list[float]:
        return [reward for _, _, reward, _ in self.steps]


@dataclass
class Report:
    environment: str
    results: list[CheckResult]
    step_latency_ms: dict[str, float]

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self.results)

    def summary(self) -> str:
        lines = [f"{'PASS' if r.passed else 'FAIL'} {r.name}: {r.detail}" for r in self.results]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "environment": self.environment,
            "passed": self.passed,
            "checks": [result.__dict__ for result in self.results],
            "step_latency_ms": self.step_latency_ms,
        }


def check_environment(
    environment: Environment,
    records: Sequence[Record] | None = None,
    *,
    episodes: int = 16,
    seed: int = 0,
) -> Report:
    kit = _Kit(environment, seed)
    results = [_run("declares reward range, max turns and name", kit.declarations)]
    try:
        kit.records = list(records) if records else environment.example_records(episodes, seed=seed)
    except Exception as error:  # noqa: BLE001 - any failure is the author's to see
        results.append(CheckResult("has records to play", False, _describe(error)))
        return Report(_name(environment), results, {})
    if not kit.records:
        results.append(CheckResult("has records to play", False, "no records: pass a dataset"))
        return Report(_name(environment), results, {})
    for name, check in (
        ("reset returns JSON chat messages", kit.reset_contract),
        ("step returns messages, finite reward, done, JSON info", kit.step_contract),
        ("episode ends within max_turns", kit.ends_in_time),
        ("episode reward inside reward_range", kit.reward_in_range),
        ("same record, seed and replies give the same episode", kit.deterministic),
        ("garbage replies are answered, not raised", kit.survives_garbage),
        ("concurrent episodes do not share state", kit.isolated),
    ):
        results.append(_run(name, check))
    latency = kit.latency()
    results.append(
        CheckResult(
            "step latency",
            True,
            f"p50 {latency['p50']:.3f} ms, p99 {latency['p99']:.3f} ms over {latency['steps']:.0f} steps",
        )
    )
    return Report(_name(environment), results, latency)


def _run(name: str, check: Callable[[], str]) -> CheckResult:
    try:
        return CheckResult(name, True, check())
    except ConformanceError as broken:
        return CheckResult(name, False, str(broken))
    except Exception as error:  # noqa: BLE001 - an environment crash is a failed check
        return CheckResult(name, False, _describe(error))


def _describe(error: BaseException) -> str:
    return f"raised {type(error).__name__}: {error}{_where_raised(error)}"


def _where_raised(error: BaseException) -> str:
    """` at FILE:LINE`: the innermost frame of the environment's own code (not the kit's, not
    Python's standard library) that the error came through; empty when there is none."""
    stdlib = sysconfig.get_paths()["stdlib"]
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if frame.filename != __file__ and not frame.filename.startswith(stdlib)
    ]
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def _name(environment: Environment) -> str:
    return getattr(environment, "name", type(environment).__name__)


def _json(value: Any, what: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as error:
        raise ConformanceError(f"{what} is not JSON-serialisable: {error}") from None


def _check_messages(messages: Any, what: str) -> None:
    if not isinstance(messages, list):
        raise ConformanceError(f"{what} must be a list of messages, got {type(messages).__name__}")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ConformanceError(
                f"{what}[{index}] needs a role in {sorted(ROLES)}: {message!r:.120}"
            )
        if not isinstance(message.get("content"), str):
            raise ConformanceError(f"{what}[{index}].content must be a string")
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise ConformanceError(f"{what}[{index}] is a tool message without its tool_call_id")
    _json(messages, what)


class _Kit:
    def __init__(self, environment: Environment, seed: int) -> None:
        self.environment = environment
        self.seed = seed
        self.records: list[Record] = []
        self.durations: list[float] = []

    def declarations(self) -> str:
        environment = self.environment
        if not isinstance(environment.reward_range, RewardRange):
            raise ConformanceError("reward_range must be a reward_envs.interface.RewardRange")
        if not isinstance(environment.max_turns, int) or environment.max_turns < 1:
            raise ConformanceError(
                f"max_turns must be a positive int, got {environment.max_turns!r}"
            )
        if not isinstance(environment.name, str) or not environment.name:
            raise ConformanceError("name must be a non-empty string")
        low, high = environment.reward_range.low, environment.reward_range.high
        return (
            f"{environment.name}: rewards in [{low}, {high}], at most {environment.max_turns} turns"
        )

    def _reset(self, record: Record, seed: int) -> tuple[Episode, list[Message]]:
        started = self.environment.reset(record, seed=seed)
        if not (
            isinstance(started, tuple) and len(started) == 2 and isinstance(started[0], Episode)
        ):
            raise ConformanceError(f"record {record.id}: reset must return (Episode, messages)")
        return started

    def _step(self, episode: Episode, reply: Reply, where: str) -> StepResult:
        began = time.perf_counter()
        try:
            result = episode.act(reply)
        except Exception as error:
            raise ConformanceError(f"{where}: {_describe(error)}") from error
        self.durations.append(time.perf_counter() - began)
        if not isinstance(result, StepResult):
            raise ConformanceError(
                f"{where}: step must return a StepResult, got {type(result).__name__}"
            )
        _check_messages(result.messages, f"{where}: step messages")
        if not isinstance(result.reward, int | float) or not math.isfinite(result.reward):
            raise ConformanceError(
                f"{where}: turn reward must be a finite number, got {result.reward!r}"
            )
        if not isinstance(result.done, bool):
            raise ConformanceError(f"{where}: done must be a bool, got {result.done!r}")
        if not isinstance(result.info, dict):
            raise ConformanceError(f"{where}: info must be a dict")
        _json(result.info, f"{where}: info")
        return result

    def play(
        self, record: Record, seed: int, replies: Callable[[list[Message], int], str | Message]
    ) -> Transcript:
        episode, first = self._reset(record, seed)
        with closed_after(episode):
            return self._played(episode, first, record, replies)

    def _played(
        self,
        episode: Episode,
        first: list[Message],
        record: Record,
        replies: Callable[[list[Message], int], str | Message],
    ) -> Transcript:
        _check_messages(first, f"record {record.id}: reset messages")
        transcript = Transcript(first=first)
        history = list(first)
        limit = self.environment.max_turns
        for turn in range(1, limit + 1):
            reply = replies(history, turn)
            parsed = Reply.of(reply, self.environment.tools)
            result = self._step(
                episode, parsed, f"record {record.id}, turn {turn}, reply {_shown(reply)}"
            )
            transcript.steps.append((reply, result.messages, float(result.reward), result.done))
            history += [parsed.message, *result.messages]
            if result.done:
                return transcript
        raise ConformanceError(f"record {record.id}: not done after max_turns={limit} turns")

    def _example_replies(self, index: int) -> Callable[[list[Message], int], str | Message]:
        rng = random.Random(self.seed * 1_000_003 + index)
        return lambda history, _turn: self.environment.example_reply(history, rng)

    def _transcripts(self) -> list[Transcript]:
        return [
            self.play(r, self.seed, self._example_replies(i)) for i, r in enumerate(self.records)
        ]

    def reset_contract(self) -> str:
        for record in self.records:
            episode, first = self._reset(record, self.seed)
            close_quietly(episode)
            _check_messages(first, f"record {record.id}: reset messages")
            if not first:
                raise ConformanceError(f"record {record.id}: reset returned no messages")
        return f"{len(self.records)} records"

    def step_contract(self) -> str:
        transcripts = self._transcripts()
        return f"{sum(len(t.steps) for t in transcripts)} steps"

    def ends_in_time(self) -> str:
        turns = [len(t.steps) for t in self._transcripts()]
        return f"mean {statistics.mean(turns):.1f} turns, max {max(turns)}"

    def reward_in_range(self) -> str:
        rewards = []
        # The default aggregate clamps the sum into the range: a sum outside it is a reward the
        # environment never meant, kept quiet; check the sum itself.
        summed = type(self.environment).aggregate is Environment.aggregate
        span = self.environment.reward_range
        for record, transcript in zip(self.records, self._transcripts(), strict=True):
            turns = transcript.turn_rewards
            total = math.fsum(turns) if summed else self.environment.aggregate(turns)
            if total not in span:
                how = f"the sum of its turn rewards {turns}, " if summed else ""
                raise ConformanceError(
                    f"record {record.id}: episode reward {total} ({how}before any clamp) is "
                    f"outside {span}: keep turn rewards inside reward_range, or override "
                    "aggregate"
                )
            rewards.append(total)
        return f"rewards from {min(rewards):.3f} to {max(rewards):.3f}, mean {statistics.mean(rewards):.3f}"

    def deterministic(self) -> str:
        first, second = self._transcripts(), self._transcripts()
        for record, a, b in zip(self.records, first, second, strict=True):
            if a != b:
                raise ConformanceError(f"record {record.id}: two runs differ ({_difference(a, b)})")
        return f"{len(first)} episodes replayed identically"

    def survives_garbage(self) -> str:
        record = self.records[0]
        garbage: list[str | Message] = [
            *GARBAGE_REPLIES,
            *garbage_tool_turns(self.environment.tools),
        ]
        for reply in garbage:
            episode, _ = self._reset(record, self.seed)
            parsed = Reply.of(reply, self.environment.tools)
            with closed_after(episode):
                self._step(episode, parsed, f"record {record.id}, garbage reply {_shown(reply)}")
        cycle = [reply for reply in garbage if reply is not GARBAGE_REPLIES[2]]
        self.play(record, self.seed, lambda _history, turn: cycle[turn % len(cycle)])
        return f"{len(garbage)} kinds of garbage, and a whole episode of it"

    def isolated(self) -> str:
        alone = self._transcripts()
        # Interleaved in one thread: every episode advances one turn at a time, as many at once
        # as the environment takes.
        at_once = self.environment.concurrent_episodes or len(self.records)
        interleaved = []
        for start in range(0, len(self.records), at_once):
            interleaved += self._interleaved(range(start, min(start + at_once, len(self.records))))
        # And on threads, all at once (as many as it takes).
        with ThreadPoolExecutor(max_workers=min(8, at_once)) as pool:
            threaded = list(
                pool.map(
                    lambda item: self.play(item[1], self.seed, self._example_replies(item[0])),
                    enumerate(self.records),
                )
            )
        for record, a, b, c in zip(self.records, alone, interleaved, threaded, strict=True):
            if a != b:
                raise ConformanceError(
                    f"record {record.id}: interleaved with others it changed ({_difference(a, b)})"
                )
            if a != c:
                raise ConformanceError(
                    f"record {record.id}: run on threads it changed ({_difference(a, c)})"
                )
        return f"{len(self.records)} episodes interleaved and threaded, unchanged"

    def _interleaved(self, indexes: range) -> list[Transcript]:
        episodes = []
        for index in indexes:
            record = self.records[index]
            episode, first = self._reset(record, self.seed)
            episodes.append(
                (episode, Transcript(first=first), list(first), self._example_replies(index))
            )
        active = list(range(len(episodes)))
        try:
            for turn in range(1, self.environment.max_turns + 1):
                for position in list(active):
                    episode, transcript, history, replies = episodes[position]
                    reply = replies(history, turn)
                    parsed = Reply.of(reply, self.environment.tools)
                    where = f"record {self.records[indexes[position]].id}, turn {turn}"
                    result = self._step(episode, parsed, where)
                    transcript.steps.append(
                        (reply, result.messages, float(result.reward), result.done)
                    )
                    history += [parsed.message, *result.messages]
                    if result.done:
                        active.remove(position)
        finally:
            for episode, *_ in episodes:
                close_quietly(episode)
        return [transcript for _, transcript, _, _ in episodes]

    def latency(self) -> dict[str, float]:
        if not self.durations:
            return {"p50": 0.0, "p99": 0.0, "steps": 0.0}
        ordered = sorted(self.durations)
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000  # noqa: E731
        return {"p50": pick(0.5), "p99": pick(0.99), "steps": float(len(ordered))}


def _shown(reply: str | Message) -> str:
    return repr(reply[:40] if isinstance(reply, str) else json.dumps(reply)[:60])


def _difference(a: Transcript, b: Transcript) -> str:
    if a.first != b.first:
        return "first messages differ"
    for turn, (x, y) in enumerate(zip(a.steps, b.steps, strict=False), start=1):
        if x != y:
            return f"turn {turn}: {x[1:]!r:.100} vs {y[1:]!r:.100}"
    return f"{len(a.steps)} vs {len(b.steps)} turns"
