"""One rollout: an episode of the environment against the model, as a rollout response.

A plain function of its inputs (environment, model, request, limits, clock) so tests and the
local trainer call it directly. Outcomes:

| what happened | stop_reason | aggregate_score |
|---|---|---|
| the environment ended the episode | end_of_conversation | the environment's aggregate |
| max turns reached first | max_turns | aggregate of the turns played |
| rollout deadline passed, or the model failed to answer | timeout | None |
| the environment raised | env_error | None |
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from domain.episodes import TRUNCATED_METRIC, TURNS_METRIC
from domain.protocol import Metric, RolloutRequest, RolloutResponse
from reward_envs.interface import Environment, Message, Record, Reply, closed_after
from reward_envs.worker.model_client import ModelClient, ModelError


@dataclass
class Rollout:
    """A played rollout: the response the trainer gets, and what the trajectory store keeps."""

    response: RolloutResponse = None  # type: ignore[assignment] - set when the rollout ends
    messages: list[Message] = field(default_factory=list)  # as the model saw and wrote them
    turn_rewards: list[float] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)  # per model turn
    policy_versions: list[int] = field(default_factory=list)  # of the turns that said


def play_rollout(
    environment: Environment,
    model: ModelClient,
    request: RolloutRequest,
    *,
    max_turns: int | None = None,
    timeout: float = 600.0,
    seed: int = 0,
    clock: Callable[[], float] = time.monotonic,
) -> Rollout:
    """One rollout: its response, the conversation and each turn's reward and generation.
    `seed`: what the environment's reset draws with (`domain.protocol.episode_seed`)."""
    played = Rollout()
    rewards = played.turn_rewards
    started = clock()
    deadline = started + timeout
    limit = min(environment.max_turns, max_turns or environment.max_turns)
    timings = {"model_seconds": 0.0, "env_seconds": 0.0}
    info: dict[str, Any] = {}

    def respond(reason: str, score: float | None, error: str | None = None) -> Rollout:
        metrics = [
            Metric(name=TURNS_METRIC, value=len(rewards)),
            Metric(name=TRUNCATED_METRIC, value=played.finish_reasons.count("length")),
            Metric(name="duration_seconds", value=clock() - started),
            *(Metric(name=name, value=value) for name, value in timings.items()),
            *(
                Metric(name=f"env/{key}", value=float(value))
                for key, value in info.items()
                if _numeric(value)
            ),
        ]
        played.response = RolloutResponse(
            sample_id=request.sample_id,
            stop_reason=reason,
            rewards={"aggregate_score": score},
            metrics=metrics,
            error=error,
        )
        return played

    began = clock()
    try:
        episode, history = environment.reset(
            Record(id=request.record_id, metadata=request.data), seed=seed
        )
        history = played.messages = list(history)
    except Exception as error:  # noqa: BLE001 - any environment failure is reported, not raised
        return respond("env_error", None, f"reset: {type(error).__name__}: {error}")
    finally:
        timings["env_seconds"] += clock() - began

    with closed_after(episode):  # its session or process let go, however the rollout ends
        for turn in range(1, limit + 1):
            remaining = deadline - clock()
            if remaining <= 0:
                return respond(
                    "timeout",
                    None,
                    f"rollout deadline of {timeout:.0f} s passed before turn {turn}",
                )
            began = clock()
            try:
                answer = model.chat(
                    history,
                    sample_id=request.sample_id,
                    step_id=f"{request.sample_id}_{turn}",
                    timeout=remaining,
                    tools=environment.tools,
                )
            except ModelError as error:
                return respond("timeout", None, f"model: {error}")
            finally:
                timings["model_seconds"] += clock() - began
            played.finish_reasons.append(answer.finish_reason)
            if answer.policy_version is not None:
                played.policy_versions.append(answer.policy_version)
            reply = Reply.of(answer.message, environment.tools)
            history.append(reply.message)
            began = clock()
            try:
                result = episode.act(reply)
            except Exception as error:  # noqa: BLE001
                return respond("env_error", None, f"step {turn}: {type(error).__name__}: {error}")
            finally:
                timings["env_seconds"] += clock() - began
            rewards.append(float(result.reward))
            info = result.info
            history += result.messages
            if result.done:
                return respond("end_of_conversation", environment.aggregate(rewards))
        return respond("max_turns", environment.aggregate(rewards))


def _numeric(value: Any) -> bool:
    return isinstance(value, bool | int | float) and not isinstance(value, complex)
