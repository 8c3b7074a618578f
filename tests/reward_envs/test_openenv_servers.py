"""OpenEnv environments as OpenEnv serves them (real servers, tests/reward_envs/openenv_servers.py):
the conformance kit passes on each, one session per episode (closed however it ends, so a
server at OpenEnv's default of one session serves rollouts in turn), a typed action's malformed
move is the model's scored move, metadata travels as metrics and never to the model, and
messages as large as OpenEnv's own client takes."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from domain.episodes import INVALID_METRIC
from domain.protocol import RolloutRequest
from reward_envs.conformance import check_environment
from reward_envs.interface import Record
from reward_envs.registry import load
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.rollout import play_rollout
from tests.reward_envs.openenv_servers import Kind, openenv_server

# Each kind of server once for the module (each takes seconds to start).
SERVERS: dict[Kind, int | None] = {"echo": None, "endless": 4, "grid": 4}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield {
            kind: stack.enter_context(
                openenv_server(kind, tmp_path_factory.mktemp(kind), max_concurrent_envs=sessions)
            )
            for kind, sessions in SERVERS.items()
        }


def request(sample: str = "r_0") -> RolloutRequest:
    return RolloutRequest(sample_id=sample, data={"prompt": "Play."})


@pytest.mark.parametrize(
    ("kind", "arguments"),
    [
        ("echo", {"observation_field": "echoed"}),  # OpenEnv's default: one session
        ("endless", {"max_turns": 3, "max_sessions": 4}),  # never done by itself
        ("grid", {"action_field": "action", "max_sessions": 4}),  # typed actions
    ],
)
def test_each_real_server_passes_the_conformance_kit(
    servers: dict[str, str], kind: str, arguments: dict
) -> None:
    environment = load("openenv", url=servers[kind], timeout_seconds=20, **arguments)
    report = check_environment(environment, episodes=4)
    assert report.passed, report.summary()
    # Every session was closed: the server has one free for a new episode at once.
    episode, _ = load("openenv", url=servers[kind], timeout_seconds=1, **arguments).reset(
        Record(id="after")
    )
    episode.close()


def test_a_one_session_server_serves_concurrent_rollouts_in_turn(servers: dict[str, str]) -> None:
    environment = load("openenv", url=servers["echo"], observation_field="echoed")
    model = CallableModel(lambda messages: "bye" if len(messages) > 2 else "hello")
    with ThreadPoolExecutor(max_workers=4) as pool:
        played = list(
            pool.map(lambda i: play_rollout(environment, model, request(f"r{i}_0")), range(4))
        )
    assert [p.response.stop_reason for p in played] == ["end_of_conversation"] * 4
    assert [p.response.aggregate_score for p in played] == [1.0] * 4


def test_a_session_held_past_the_rollouts_time_is_an_env_error_that_says_the_fix(
    servers: dict[str, str],
) -> None:
    holder = load("openenv", url=servers["echo"])
    held, _ = holder.reset(Record(id="held"))
    try:
        hurried = load("openenv", url=servers["echo"], timeout_seconds=0.5)
        response = play_rollout(hurried, CallableModel(lambda _: "hi"), request()).response
    finally:
        held.close()
    assert response.stop_reason == "env_error" and response.aggregate_score is None
    assert "CAPACITY_REACHED" in (response.error or "")
    assert "max_concurrent_envs=N" in (response.error or "")


def test_an_episode_the_server_never_ends_ends_at_max_turns_and_frees_its_session(
    servers: dict[str, str],
) -> None:
    environment = load("openenv", url=servers["endless"], max_turns=3, max_sessions=4)
    played = play_rollout(environment, CallableModel(lambda _: "more"), request())
    assert played.response.stop_reason == "end_of_conversation"
    assert sum(m["role"] == "assistant" for m in played.messages) == 3


def test_a_malformed_typed_move_is_the_models_scored_move_not_an_env_error(
    servers: dict[str, str],
) -> None:
    moves = iter(["JUMP", "RIGHT", "RIGHT"])
    environment = load(
        "openenv", url=servers["grid"], action_field="action", max_sessions=4,
        action_hint="Answer with one of UP, DOWN, LEFT, RIGHT.",
    )  # fmt: skip
    played = play_rollout(environment, CallableModel(lambda _: next(moves)), request())
    response = played.response
    assert (response.stop_reason, response.aggregate_score) == ("end_of_conversation", 1.0)
    metrics = {m.name: m.value for m in response.metrics}
    # The invalid moves of the episode, counted as Wordle counts them (domain/episodes reads it).
    assert (metrics["turns"], metrics[INVALID_METRIC]) == (3, 1)
    shown = played.messages[2]["content"]
    assert shown == (
        "Invalid action (action: Input should be 'UP', 'DOWN', 'LEFT' or 'RIGHT'). Answer with "
        "one of UP, DOWN, LEFT, RIGHT."
    )


def test_metadata_travels_as_metrics_and_is_never_shown_to_the_model(
    servers: dict[str, str],
) -> None:
    environment = load("openenv", url=servers["echo"])
    model = CallableModel(lambda messages: "bye now" if len(messages) > 2 else "hello")
    played = play_rollout(environment, model, request())
    metrics = {m.name: m.value for m in played.response.metrics}
    assert metrics["env/length"] == len("bye now")
    assert all("metadata" not in str(m.get("content")) for m in played.messages)


def test_messages_as_large_as_openenvs_own_client_takes(servers: dict[str, str]) -> None:
    """An echo of 2 MiB: over websockets' default limit of 1 MiB, within OpenEnv's 100 MiB."""
    environment = load("openenv", url=servers["echo"], observation_field="echoed")
    episode, _ = environment.reset(Record(id="big"))
    try:
        large = "x" * (2 * 1024 * 1024)
        assert episode.step(large).messages[0]["content"] == large
    finally:
        episode.close()
