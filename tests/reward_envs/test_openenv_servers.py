"""OpenEnv environments as OpenEnv serves them (real servers, tests/reward_envs/openenv_servers.py):
each passes the conformance kit; one session per episode, closed however it ends, so a server
at OpenEnv's default of one session serves rollouts in turn; a move the server cannot take
(a typed action's wrong value, a JSON move that is not JSON, a bad tool call) is the model's
scored move; MCP tools are the model's tools; metadata travels as metrics and never to the
model; messages as large as OpenEnv's own client takes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from typer.testing import CliRunner

from domain.episodes import INVALID_METRIC
from domain.protocol import RolloutRequest
from mtrl.cli import app
from reward_envs.conformance import check_environment
from reward_envs.interface import Message, Record, Reply, tool_turn
from reward_envs.registry import load
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.rollout import play_rollout

# Each kind's arguments beyond its URL: what its server needs said.
ARGUMENTS: dict[str, dict] = {
    "echo": {"observation_field": "echoed"},  # OpenEnv's default: one session
    "endless": {"max_turns": 3, "max_sessions": 4},  # never done by itself
    "guess": {"observation_field": "hint", "max_sessions": 8},
    "grid": {"max_sessions": 4},  # a typed action's one field, read from /schema
    "walk": {"max_sessions": 4},  # a JSON action
    "sums": {"max_sessions": 4, "observation_field": "metadata.question"},  # MCP tools
}


def request(sample: str = "r_0") -> RolloutRequest:
    return RolloutRequest(sample_id=sample, data={"prompt": "Play."})


def metrics_of(played) -> dict[str, float]:
    return {m.name: m.value for m in played.response.metrics}


def bisect(messages: Sequence[Message]) -> str:
    """Guesses by the hints so far: finds any number from 1 to 10 within four guesses."""
    low, high, guess = 1, 10, 5
    for message in messages[1:]:
        content = str(message.get("content"))
        if message["role"] == "assistant":
            guess = int(content)
        elif "higher" in content:
            low = guess + 1
        elif "lower" in content:
            high = guess - 1
    return str((low + high) // 2)


@pytest.mark.parametrize("kind", ARGUMENTS)
def test_each_real_server_passes_the_conformance_kit(openenv: dict[str, str], kind: str) -> None:
    environment = load("openenv", url=openenv[kind], timeout_seconds=20, **ARGUMENTS[kind])
    report = check_environment(environment, episodes=4)
    assert report.passed, report.summary()
    # Every session was closed: the server has one free for a new episode at once.
    again = load("openenv", url=openenv[kind], timeout_seconds=1, **ARGUMENTS[kind])
    episode, _ = again.reset(Record(id="after"))
    episode.close()


def test_the_worker_plays_episodes_with_the_servers_rewards_seeds_and_metadata(
    openenv: dict[str, str],
) -> None:
    environment = load("openenv", url=openenv["guess"], **ARGUMENTS["guess"])
    for seed in range(10):  # the number is seed % 10 + 1: the seed reached the server
        played = play_rollout(environment, CallableModel(bisect), request(f"n{seed}_0"), seed=seed)
        assert (played.response.stop_reason, played.response.aggregate_score) == (
            "end_of_conversation", 1.0,
        )  # fmt: skip
        assert 1 <= metrics_of(played)["env/guesses"] <= 4
    first = environment.reset(Record(id="r", metadata={"prompt": "Play."}), seed=3)[1]
    assert first == [{"role": "user", "content": "Play.\n\nGuess a number from 1 to 10."}]


def test_observations_are_shown_as_asked(openenv: dict[str, str]) -> None:
    whole = load("openenv", url=openenv["guess"], max_sessions=8)
    episode, first = whole.reset(Record(id="a"), seed=4)  # the number 5
    assert first == [{"role": "user", "content": '{"hint": "Guess a number from 1 to 10."}'}]
    won = episode.step("5")
    assert won.messages == [{"role": "user", "content": '{"hint": "correct"}'}]
    assert (won.reward, won.done, won.info) == (1.0, True, {"guesses": 1, "invalid": 0})
    assert episode.step("5") == type(won)(messages=[], reward=0.0, done=True, info={
        "error": "episode is over"
    })  # fmt: skip
    missing = load("openenv", url=openenv["guess"], observation_field="score", max_sessions=8)
    episode, shown = missing.reset(Record(id="b"))
    episode.close()
    assert shown == [{"role": "user", "content": ""}]
    nested = load("openenv", url=openenv["guess"], observation_field="metadata.guesses")
    assert nested.shown({"metadata": {"guesses": 2}}) == {"role": "user", "content": "2"}


def test_a_server_error_is_an_env_error_never_a_reward(openenv: dict[str, str]) -> None:
    environment = load("openenv", url=openenv["guess"], max_sessions=8)
    blown = play_rollout(environment, CallableModel(lambda _: "explode"), request()).response
    assert blown.stop_reason == "env_error" and blown.aggregate_score is None
    assert "EXECUTION_ERROR: the environment blew up" in (blown.error or "")


def test_a_one_session_server_serves_concurrent_rollouts_in_turn(openenv: dict[str, str]) -> None:
    environment = load("openenv", url=openenv["echo"], observation_field="echoed")
    model = CallableModel(lambda messages: "bye" if len(messages) > 2 else "hello")
    with ThreadPoolExecutor(max_workers=4) as pool:
        played = list(
            pool.map(lambda i: play_rollout(environment, model, request(f"r{i}_0")), range(4))
        )
    assert [p.response.stop_reason for p in played] == ["end_of_conversation"] * 4
    assert [p.response.aggregate_score for p in played] == [1.0] * 4


def test_a_session_held_past_the_rollouts_time_is_an_env_error_that_says_the_fix(
    openenv: dict[str, str],
) -> None:
    holder = load("openenv", url=openenv["echo"])
    held, _ = holder.reset(Record(id="held"))
    try:
        hurried = load("openenv", url=openenv["echo"], timeout_seconds=0.5)
        response = play_rollout(hurried, CallableModel(lambda _: "hi"), request()).response
        assert held.step("bye").done  # the held session still plays
    finally:
        held.close()
    assert response.stop_reason == "env_error" and response.aggregate_score is None
    assert "CAPACITY_REACHED" in (response.error or "")
    assert "max_concurrent_envs=N" in (response.error or "")


def test_an_episode_the_server_never_ends_ends_at_max_turns_and_frees_its_session(
    openenv: dict[str, str],
) -> None:
    environment = load("openenv", url=openenv["endless"], max_turns=3, max_sessions=4)
    played = play_rollout(environment, CallableModel(lambda _: "more"), request())
    assert played.response.stop_reason == "end_of_conversation"
    assert sum(m["role"] == "assistant" for m in played.messages) == 3


def test_a_malformed_typed_move_is_the_models_scored_move_not_an_env_error(
    openenv: dict[str, str],
) -> None:
    moves = iter(["JUMP", "RIGHT", "RIGHT"])
    environment = load(
        "openenv", url=openenv["grid"], max_sessions=4,
        action_hint="Answer with one of UP, DOWN, LEFT, RIGHT.",
    )  # fmt: skip
    assert environment.action_field == "action"  # read from the server's /schema
    played = play_rollout(environment, CallableModel(lambda _: next(moves)), request())
    response = played.response
    assert (response.stop_reason, response.aggregate_score) == ("end_of_conversation", 1.0)
    metrics = metrics_of(played)
    # The invalid moves of the episode, counted as Wordle counts them (domain/episodes reads it).
    assert (metrics["turns"], metrics[INVALID_METRIC]) == (3, 1)
    assert played.messages[2]["content"] == (
        "Invalid action (action: Input should be 'UP', 'DOWN', 'LEFT' or 'RIGHT'). Answer with "
        "one of UP, DOWN, LEFT, RIGHT."
    )


def test_a_json_move_is_the_action_and_one_that_is_not_json_is_a_scored_bad_move(
    openenv: dict[str, str],
) -> None:
    moves = iter([
        "go right",  # not JSON
        '{"direction": "RIGHT", "steps": 5}',  # refused by the action's model
        '```json\n{"direction": "RIGHT", "steps": 2}\n```',  # as models write it
    ])  # fmt: skip
    environment = load("openenv", url=openenv["walk"], max_sessions=4)
    assert environment.action_format == "json"
    played = play_rollout(environment, CallableModel(lambda _: next(moves)), request())
    assert (played.response.stop_reason, played.response.aggregate_score) == (
        "end_of_conversation", 1.0,
    )  # fmt: skip
    assert metrics_of(played)[INVALID_METRIC] == 2
    shown = [m["content"] for m in played.messages if m["role"] == "user"][1:3]
    assert shown == [
        "Invalid action (not JSON: Expecting value; a move is a JSON object with the fields "
        "direction, steps).",
        "Invalid action (steps: Input should be less than or equal to 2).",
    ]


def sums_player(messages: Sequence[Message]) -> Message | str:
    """Answers in text first, then calls a tool wrongly, then adds, then submits the sum."""
    turn = sum(m["role"] == "assistant" for m in messages)
    calls = [
        None,
        ("add", '{"a": "x"}'),
        ("multiply", "{}"),
        ("add", '{"a": 17, "b": 25}'),
        ("submit", json.dumps({"answer": messages[-1].get("content")})),
    ]
    if calls[turn] is None:
        return "It is 42."
    name, arguments = calls[turn]
    return tool_turn(name, arguments, call_id=f"call_{turn}")


def test_an_mcp_environments_tools_are_the_models_tools(openenv: dict[str, str]) -> None:
    environment = load("openenv", url=openenv["sums"], **ARGUMENTS["sums"])
    assert [tool["function"]["name"] for tool in environment.tools] == ["add", "submit"]
    assert environment.tools[0]["function"]["parameters"]["required"] == ["a", "b"]
    played = play_rollout(environment, CallableModel(sums_player), request())
    assert (played.response.stop_reason, played.response.aggregate_score) == (
        "end_of_conversation", 1.0,
    )  # fmt: skip
    # The text turn, the bad arguments and the unknown tool: three moves it could not take.
    assert (metrics_of(played)["turns"], metrics_of(played)[INVALID_METRIC]) == (5, 3)
    assert played.response.succeeded is True  # the server's metadata.success: the pass rates' flag
    assert played.messages[0]["content"] == "Play.\n\nWhat is 17 + 25?"
    answers = [m for m in played.messages if m["role"] in ("tool", "user")][1:]
    assert answers[0] == {"role": "user", "content": "Invalid action (no tool call; call one of: "
                          "add, submit)."}  # fmt: skip
    assert answers[1]["tool_call_id"] == "call_1" and "valid integer" in answers[1]["content"]
    assert answers[2]["content"] == "error: unknown tool 'multiply' (tools: add, submit)"
    assert answers[3] == {"role": "tool", "tool_call_id": "call_3", "content": "42"}


def test_every_call_of_a_turn_is_answered_even_after_one_ends_the_episode(
    openenv: dict[str, str],
) -> None:
    environment = load("openenv", url=openenv["sums"], **ARGUMENTS["sums"])
    episode, _ = environment.reset(Record(id="two"))
    submit = tool_turn("submit", '{"answer": "41"}', call_id="a")
    also = tool_turn("add", '{"a": 1, "b": 2}', call_id="b")["tool_calls"]
    turn = Reply.of({**submit, "tool_calls": submit["tool_calls"] + also}, environment.tools)
    result = episode.act(turn)
    assert (result.done, result.reward) == (True, 0.0)
    assert [(m["tool_call_id"], m["content"]) for m in result.messages] == [
        ("a", ""), ("b", "error: the episode is over"),
    ]  # fmt: skip


def test_metadata_travels_as_metrics_and_is_never_shown_to_the_model(
    openenv: dict[str, str],
) -> None:
    environment = load("openenv", url=openenv["echo"])
    model = CallableModel(lambda messages: "bye now" if len(messages) > 2 else "hello")
    played = play_rollout(environment, model, request())
    assert metrics_of(played)["env/length"] == len("bye now")
    assert all("metadata" not in str(m.get("content")) for m in played.messages)


def test_messages_as_large_as_openenvs_own_client_takes(openenv: dict[str, str]) -> None:
    """An echo of 2 MiB: over websockets' default limit of 1 MiB, within OpenEnv's 100 MiB."""
    environment = load("openenv", url=openenv["echo"], observation_field="echoed")
    episode, _ = environment.reset(Record(id="big"))
    try:
        large = "x" * (2 * 1024 * 1024)
        assert episode.step(large).messages[0]["content"] == large
    finally:
        episode.close()


def test_env_check_and_play_take_the_environments_arguments(openenv: dict[str, str]) -> None:
    url = ["--arg", f"url={openenv['guess']}", "--arg", "observation_field=hint"]
    checked = CliRunner().invoke(app, ["env", "check", "openenv", *url, "--episodes", "3"])
    assert checked.exit_code == 0, checked.output
    played = CliRunner().invoke(app, ["env", "play", "openenv", *url], input="7\n1\n")
    assert played.exit_code == 0, played.output
    assert "lower" in played.output and "episode reward: 1.000" in played.output  # seed 0: 1
    result = CliRunner().invoke(app, ["env", "check", "openenv", "--arg", "url"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


def test_env_play_calls_an_mcp_environments_tools(openenv: dict[str, str]) -> None:
    arguments = ["--arg", f"url={openenv['sums']}", "--arg", "observation_field=metadata.question"]
    played = CliRunner().invoke(
        app,
        ["env", "play", "openenv", *arguments],
        input='add {"a": 17, "b": 25}\nsubmit {"answer": "42"}\n',
    )
    assert played.exit_code == 0, played.output
    assert "What is 17 + 25?" in played.output and "Tools: add, submit" in played.output
    assert "episode reward: 1.000" in played.output


def test_env_play_answers_an_environments_failure_in_one_line(openenv: dict[str, str]) -> None:
    """The server answers `explode` with EXECUTION_ERROR: `mtrl env play` says so and exits 2,
    no traceback."""
    result = CliRunner().invoke(
        app, ["env", "play", "openenv", "--arg", f"url={openenv['guess']}"], input="explode\n"
    )
    assert result.exit_code == 2, result.output
    assert "error: turn 1: OpenEnvError: step: EXECUTION_ERROR: the environment blew up" in (
        result.output
    )
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("kind", "prompt"),
    [
        (
            "grid",
            "Each reply is your move (the action's action: one of UP, DOWN, LEFT, RIGHT), "
            "nothing else.",
        ),
        (
            "walk",
            "Each reply is your move, a JSON object with the fields direction, steps, nothing "
            "else.",
        ),
        ("sums", "Act with the tools you are given until the task is done."),
    ],
)
def test_env_records_writes_a_dataset_that_says_how_a_move_is_made(
    openenv: dict[str, str], kind: str, prompt: str
) -> None:
    written = CliRunner().invoke(
        app, ["env", "records", "openenv", "--arg", f"url={openenv[kind]}", "--count", "3"]
    )
    assert written.exit_code == 0, written.output
    lines = [json.loads(line) for line in written.stdout.splitlines()]
    assert [line["metadata"]["prompt"] for line in lines] == [prompt] * 3
    # An MCP environment's records carry its tools, as the model is offered them.
    assert ("tools" in lines[0]) == (kind == "sums")
    told = load("openenv", url=openenv[kind], prompt="Reach the goal.").example_records(1)
    assert told[0].metadata == {"prompt": "Reach the goal."}


def test_env_play_shows_a_malformed_typed_move_as_the_model_would_see_it(
    openenv: dict[str, str],
) -> None:
    """Before, an invalid move on a typed-action server ended `mtrl env play` in a traceback."""
    played = CliRunner().invoke(
        app,
        ["env", "play", "openenv", "--arg", f"url={openenv['grid']}"],
        input="JUMP\nRIGHT\nRIGHT\n",
    )
    assert played.exit_code == 0, played.output
    assert "Invalid action (action: Input should be 'UP', 'DOWN', 'LEFT' or 'RIGHT')." in (
        played.output
    )
    assert "episode reward: 1.000" in played.output and "Traceback" not in played.output
