"""One rollout as a response: every stop reason, and never a silent 0 for a failure."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from domain.protocol import RolloutRequest, episode_seed
from reward_envs.interface import Message
from reward_envs.wordle import load_environment
from reward_envs.worker.model_client import CallableModel, ModelClient, ModelError, ModelTurn
from reward_envs.worker.rollout import play_rollout

WORDLE = load_environment()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request(answer: str = "crane", sample_id: str = "rec-7_3") -> RolloutRequest:
    return RolloutRequest(sample_id=sample_id, data={"answer": answer})


def replies(*words: str) -> CallableModel:
    script = iter(words)
    return CallableModel(lambda _messages: next(script))


def metric(response, name: str) -> float:
    return next(m.value for m in response.metrics if m.name == name)


def test_a_won_episode_reports_the_environment_reward() -> None:
    response = play_rollout(WORDLE, replies("[slate]", "[crane]"), request()).response
    assert response.stop_reason == "end_of_conversation"
    assert response.aggregate_score == pytest.approx(0.9)
    assert metric(response, "turns") == 2 and metric(response, "env/won") == 1.0
    assert response.sample_id == "rec-7_3"


def test_the_record_id_and_data_reach_the_environment() -> None:
    seen: list[Sequence[Message]] = []

    def model(messages: Sequence[Message]) -> str:
        seen.append(list(messages))
        return "[lapel]"

    response = play_rollout(
        WORDLE, CallableModel(model), request(answer="lapel", sample_id="my_record_12")
    ).response
    assert response.aggregate_score == 1.0
    assert "Guess 1 of 6" in seen[0][0]["content"]


def test_max_turns_cuts_the_episode_short() -> None:
    response = play_rollout(
        WORDLE, replies("[slate]", "[moist]", "[pudgy]"), request(), max_turns=2
    ).response
    assert response.stop_reason == "max_turns"
    assert response.aggregate_score == 0.0 and metric(response, "turns") == 2


def test_a_slow_model_times_out_without_a_reward() -> None:
    clock = FakeClock()

    def slow(_messages: Sequence[Message]) -> str:
        clock.now += 400  # each turn takes 400 s of the 600 s budget
        return "[slate]"

    response = play_rollout(
        WORDLE, CallableModel(slow), request(), timeout=600, clock=clock
    ).response
    assert response.stop_reason == "timeout" and response.aggregate_score is None
    assert "deadline of 600 s passed before turn 3" in response.error


def test_a_failing_model_is_a_timeout_not_a_zero() -> None:
    def broken(_messages: Sequence[Message]) -> str:
        raise ModelError("HTTP 503 from proxy")

    response = play_rollout(WORDLE, CallableModel(broken), request()).response
    assert response.stop_reason == "timeout" and response.aggregate_score is None
    assert "HTTP 503" in response.error


class Exploding(type(WORDLE)):
    def reset(self, record, *, seed=0):
        episode, first = super().reset(record, seed=seed)

        def step(reply):
            raise RuntimeError("scorer crashed")

        episode.step = step
        return episode, first


def test_an_environment_crash_is_env_error_not_a_zero() -> None:
    response = play_rollout(Exploding(), replies("[slate]"), request()).response
    assert response.stop_reason == "env_error" and response.aggregate_score is None
    assert "step 1: RuntimeError: scorer crashed" in response.error


def test_a_bad_record_is_env_error_at_reset() -> None:
    response = play_rollout(WORDLE, replies(), request(answer="toolong")).response
    assert response.stop_reason == "env_error" and "reset: ValueError" in response.error


def test_a_solver_as_the_model_wins() -> None:
    from reward_envs.wordle.solver import default_solver

    solver = default_solver()

    def play(messages: Sequence[Message]) -> str:
        # Reads the environment's feedback lines ("SLATE: X G Y X X"), nothing else.
        history = [
            (found.group(1).lower(), found.group(2).replace(" ", ""))
            for message in messages
            if message["role"] == "user"
            and (found := re.match(r"([A-Z]{5}): ([GYX](?: [GYX]){4})", message["content"]))
        ]
        return f"[{solver.next_guess(history)}]"

    response = play_rollout(WORDLE, CallableModel(play), request(answer="lapel")).response
    assert solver.play("lapel").guesses == ("raise", "laten", "label", "lapel")
    # Solved on the fourth guess: 0.5 + 0.5 x (6 - 4) / 5 (docs/users/reward-environments.md, the Wordle reward table).
    assert response.stop_reason == "end_of_conversation"
    assert response.aggregate_score == pytest.approx(0.7)


class Recording(type(WORDLE)):
    """Wordle that records the record and seed each episode was drawn with."""

    def __init__(self) -> None:
        super().__init__()
        self.drawn: list[tuple[str, int]] = []

    def reset(self, record, *, seed=0):
        self.drawn.append((record.id, seed))
        return super().reset(record, seed=seed)


def test_an_episode_is_drawn_with_its_run_and_record_seed() -> None:
    """A record with no answer is a secret drawn by seed: every sample of the record in a run
    plays the same secret (a GRPO group is one task), another run draws again, and a run
    replayed draws the same."""
    environment = Recording()
    open_ended = [RolloutRequest(sample_id=f"rec-7_{k}", data={"prompt": "Play."}) for k in (0, 1)]
    for run in ("run-a", "run-a", "run-b"):
        for sample in open_ended:
            play_rollout(
                environment, replies("[slate]"), sample, max_turns=1,
                seed=episode_seed(run, sample.record_id),
            )  # fmt: skip
    seeds = [seed for record, seed in environment.drawn if record == "rec-7"]
    assert len(seeds) == 6 and seeds[0] == seeds[1] == seeds[2] == seeds[3] != seeds[4]
    assert seeds[4] == seeds[5] and episode_seed("run-a", "rec-7") != episode_seed("run-a", "rec-8")


class CutModel(ModelClient):
    """Answers each turn with a guess; the turns in `cut` end at the token limit."""

    def __init__(self, *, cut: set[int], version: int | None = None) -> None:
        self.cut, self.version, self.turn = cut, version, 0

    def chat(self, messages, *, sample_id, step_id, timeout, tools=()) -> ModelTurn:  # noqa: ANN001
        self.turn += 1
        reason = "length" if self.turn in self.cut else "stop"
        return ModelTurn({"role": "assistant", "content": "[slate]"}, reason, self.version)


def test_turns_cut_at_the_token_limit_are_counted_in_the_response_and_kept() -> None:
    played = play_rollout(WORDLE, CutModel(cut={2, 3}, version=4), request(), max_turns=3)
    assert metric(played.response, "truncated_turns") == 2
    assert played.finish_reasons == ["stop", "length", "length"]
    assert played.policy_versions == [4, 4, 4] and played.turn_rewards == [0.0, 0.0, 0.0]
    # The conversation as the model saw and wrote it: the task, then each guess and its answer.
    assert [m["role"] for m in played.messages] == ["user"] + ["assistant", "user"] * 3
    assert metric(play_rollout(WORDLE, CutModel(cut=set()), request(), max_turns=1).response, "truncated_turns") == 0  # fmt: skip
