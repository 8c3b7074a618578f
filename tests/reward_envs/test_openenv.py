"""An OpenEnv environment through its WebSocket session protocol (a fake server that speaks it,
tests/reward_envs/fake_openenv.py): the conformance kit, the worker's rollouts, refusals."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from typer.testing import CliRunner

from domain.backends import RunContext, worker_environment
from domain.protocol import RolloutRequest
from mtrl.cli import app
from reward_envs.conformance import check_environment
from reward_envs.interface import Message, Record
from reward_envs.openenv import OpenEnvError, session_url
from reward_envs.registry import EnvironmentNotFound, load
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.rollout import play_rollout
from reward_envs.worker.settings import WorkerSettings
from tests.reward_envs.fake_openenv import serving
from training_configs.schema import load_training_config


def bisect(messages: Sequence[Message]) -> str:
    """Guesses by the hints so far: finds any number from 1 to 10 within four guesses."""
    low, high = 1, 10
    guess = 5
    for message in messages[1:]:
        content = str(message.get("content"))
        if message["role"] == "assistant":
            guess = int(content)
        elif "higher" in content:
            low = guess + 1
        elif "lower" in content:
            high = guess - 1
    return str((low + high) // 2)


def test_the_session_url_is_the_servers_ws_endpoint() -> None:
    assert session_url("http://envs.local:8000") == "ws://envs.local:8000/ws"
    assert session_url("https://envs.example/team/") == "wss://envs.example/team/ws"
    assert session_url("ws://h:1/ws") == "ws://h:1/ws"
    with pytest.raises(ValueError, match="http"):
        session_url("envs.local:8000")


def test_an_openenv_environment_passes_the_conformance_kit_one_session_per_episode() -> None:
    with serving() as (url, server):
        environment = load("openenv", url=url, action_field="message", observation_field="hint")
        report = check_environment(environment, episodes=6)
        assert report.passed, report.summary()
    assert server.opened > 6 and server.sessions == 0  # every session closed


def test_the_worker_plays_openenv_episodes_with_the_servers_rewards_and_metadata() -> None:
    with serving() as (url, server):
        environment = load("openenv", url=url, observation_field="hint")
        scores = []
        for seed in range(10):
            request = RolloutRequest(sample_id=f"n{seed}_0", data={"prompt": "Play."})
            response = play_rollout(environment, CallableModel(bisect), request, seed=seed).response
            scores.append(response.aggregate_score)
            metrics = {m.name: m.value for m in response.metrics}
            assert response.stop_reason == "end_of_conversation"
            assert 1 <= metrics["env/guesses"] <= 4
        assert scores == [1.0] * 10
        assert [reset["seed"] for reset in server.resets] == list(range(10))
        assert server.resets[0]["episode_id"] == "n0"
        first = environment.reset(Record(id="r", metadata={"prompt": "Play."}), seed=3)[1]
        assert first == [{"role": "user", "content": "Play.\n\nGuess a number from 1 to 10."}]


def test_a_server_error_is_an_env_error_never_a_reward() -> None:
    with serving(max_sessions=1) as (url, _server):
        environment = load("openenv", url=url)
        request = RolloutRequest(sample_id="x_0", data={"prompt": "Play."})
        blown = play_rollout(environment, CallableModel(lambda _: "explode"), request).response
        assert blown.stop_reason == "env_error" and blown.aggregate_score is None
        assert "EXECUTION_ERROR: the environment blew up" in (blown.error or "")
        hurried = load("openenv", url=url, timeout_seconds=0.5)
        episode, _ = hurried.reset(Record(id="hold"), seed=1)  # takes the only session
        full = play_rollout(hurried, CallableModel(lambda _: "5"), request).response
        assert full.stop_reason == "env_error" and "CAPACITY_REACHED" in (full.error or "")
        assert "max_concurrent_envs" in (full.error or "")  # and how to serve more
        assert episode.step("2").done  # the held session still plays (seed 1: the number 2)
    with pytest.raises(OpenEnvError, match="cannot open a session"):
        environment.reset(Record(id="gone"))


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(EnvironmentNotFound, match="needs url"):
        load("openenv")
    with pytest.raises(EnvironmentNotFound, match="unexpected keyword argument 'colour'"):
        load("openenv", url="http://h:1", colour="red")


def test_env_check_takes_the_environments_arguments() -> None:
    with serving() as (url, _server):
        result = CliRunner().invoke(
            app,
            ["env", "check", "openenv", "--arg", f"url={url}", "--arg", "observation_field=hint",
             "--arg", "max_turns=6", "--episodes", "3"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["env", "check", "openenv", "--arg", "url"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


def test_a_configs_environment_args_reach_the_reward_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """environment_args travel as MTRL_ENVIRONMENT_ARGS (JSON) to the worker's settings, which
    load the environment with them; a config without them sets nothing."""
    config = load_training_config("rft_multiturn_lora").model_copy(
        update={
            "environment": "openenv",
            "environment_args": {"url": "http://envs:8000", "max_turns": 6},
        }
    )
    run = RunContext(
        run_id="r-1",
        queues={"rollout_requests": "https://sqs/requests.fifo", "dlq": "https://sqs/dlq.fifo"},
        router_url=None,
        run_token="token",
        bucket="data",
        dataset_key="training-data/a.jsonl",
        dataset_version=None,
        output_prefix="runs/r-1/",
        config=config,
    )
    variables = worker_environment(run)
    assert json.loads(variables["MTRL_ENVIRONMENT_ARGS"]) == {
        "url": "http://envs:8000",
        "max_turns": 6,
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = WorkerSettings()
    environment = load(settings.environment, **settings.environment_args)
    assert environment.max_turns == 6 and environment.url == "ws://envs:8000/ws"
    plain = RunContext(**{**run.__dict__, "config": load_training_config("rft_multiturn_lora")})
    assert "MTRL_ENVIRONMENT_ARGS" not in worker_environment(plain)


def test_observations_are_shown_as_asked_and_sessions_end_with_a_close() -> None:
    with serving() as (url, server):
        whole = load("openenv", url=url)
        episode, first = whole.reset(Record(id="a"), seed=4)  # the number 5
        assert first == [{"role": "user", "content": '{"hint": "Guess a number from 1 to 10."}'}]
        won = episode.step("5")
        assert won.messages == [{"role": "user", "content": '{"hint": "correct"}'}]
        assert (won.reward, won.done, won.info) == (1.0, True, {"guesses": 1, "invalid": 0})
        over = episode.step("5")
        assert (over.messages, over.reward, over.done) == ([], 0.0, True)
        missing = load("openenv", url=url, observation_field="score")
        assert missing.reset(Record(id="b"))[1] == [{"role": "user", "content": ""}]
        assert whole.shown({"board": [[1, 2]], "é": 1}) == {
            "role": "user", "content": '{"board": [[1, 2]], "é": 1}',
        }  # fmt: skip
        assert load("openenv", url=url, observation_field="board").shown({"board": [1]}) == {
            "role": "user", "content": "[1]",
        }  # fmt: skip
    assert server.closed == 1  # the finished episode closed its session


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("silent", "step: TimeoutError"),
        ("babble", "step: JSONDecodeError"),
        ("state", "step: expected an observation, got 'state'"),
    ],
)
def test_a_misbehaving_server_is_an_env_error(reply: str, problem: str) -> None:
    with serving() as (url, _server):
        environment = load("openenv", url=url, timeout_seconds=0.2)
        request = RolloutRequest(sample_id="m_0", data={"prompt": "Play."})
        response = play_rollout(environment, CallableModel(lambda _: reply), request).response
        assert response.stop_reason == "env_error" and problem in (response.error or "")


def test_a_reward_that_is_not_a_number_counts_as_none() -> None:
    with serving() as (url, _server):
        episode, _ = load("openenv", url=url).reset(Record(id="n"))
        assert episode.step("nan").reward == 0.0


def test_env_play_answers_an_environments_failure_in_one_line() -> None:
    """The server answers `explode` with EXECUTION_ERROR: `mtrl env play` says so and exits 2,
    no traceback."""
    with serving() as (url, _server):
        result = CliRunner().invoke(
            app, ["env", "play", "openenv", "--arg", f"url={url}"], input="explode\n"
        )
    assert result.exit_code == 2, result.output
    assert "error: turn 1: OpenEnvError: step: EXECUTION_ERROR: the environment blew up" in (
        result.output
    )
    assert "Traceback" not in result.output
