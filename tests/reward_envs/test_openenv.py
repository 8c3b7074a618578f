"""An OpenEnv environment's arguments, how it reads a server's action schema, and what it does
with a server that misbehaves as no real one does (tests/reward_envs/fake_openenv.py). What
real OpenEnv servers do is in test_openenv_servers.py."""

from __future__ import annotations

import enum
import json

import pytest
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action
from pydantic import BaseModel

from domain.backends import RunContext, worker_environment
from domain.protocol import RolloutRequest
from reward_envs.interface import Record
from reward_envs.openenv import OpenEnvError, session_url
from reward_envs.openenv.env import action_format_of
from reward_envs.openenv.protocol import http_url
from reward_envs.registry import EnvironmentNotFound, load
from reward_envs.worker.model_client import CallableModel
from reward_envs.worker.rollout import play_rollout
from reward_envs.worker.settings import WorkerSettings
from tests.reward_envs.fake_openenv import misbehaving_server
from tests.reward_envs.openenv_servers import EchoAction, MoveAction, WalkAction
from training_configs.schema import load_training_config


def test_the_session_url_is_the_servers_ws_endpoint_and_its_http_endpoints_beside_it() -> None:
    assert session_url("http://envs.local:8000") == "ws://envs.local:8000/ws"
    assert session_url("https://envs.example/team/") == "wss://envs.example/team/ws"
    assert session_url("ws://h:1/ws") == "ws://h:1/ws"
    with pytest.raises(ValueError, match="http"):
        session_url("envs.local:8000")
    assert http_url("wss://envs.example/team/ws", "/schema") == "https://envs.example/team/schema"
    assert http_url("ws://h:1/ws", "/mcp") == "http://h:1/mcp"


class Colour(enum.Enum):
    RED = "red"


class ColourAction(Action):
    colour: Colour


class CountAction(Action):
    count: int


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (EchoAction, ("text", "message")),  # OpenEnv's echo template
        (MoveAction, ("text", "action")),  # a Literal: a string with an enum
        (ColourAction, ("text", "colour")),  # an Enum: a $ref to a string
        (CountAction, ("json", None)),  # one field, not text
        (WalkAction, ("json", None)),  # two fields
        (CallToolAction, ("tools", None)),  # OpenEnv's MCP environments
    ],
)
def test_the_action_format_is_read_from_openenvs_own_action_schemas(
    action: type[BaseModel], expected: tuple[str, str | None]
) -> None:
    # The schema as the server's /schema sends it: the action class's model_json_schema().
    assert action_format_of(json.loads(json.dumps(action.model_json_schema()))) == expected


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(EnvironmentNotFound, match="needs url"):
        load("openenv")
    with pytest.raises(EnvironmentNotFound, match="unexpected keyword argument 'colour'"):
        load("openenv", url="http://h:1", colour="red")
    with pytest.raises(EnvironmentNotFound, match="action_format 'xml': one of auto, text"):
        load("openenv", url="http://h:1", action_format="xml")
    with pytest.raises(EnvironmentNotFound, match="action_field is for text actions"):
        load("openenv", url="http://h:1", action_format="json", action_field="move")


def test_an_unreachable_server_is_a_reset_error_naming_where_it_looked() -> None:
    environment = load("openenv", url="http://127.0.0.1:9", timeout_seconds=1)  # auto: /schema
    played = play_rollout(environment, CallableModel(lambda _: "hi"), RolloutRequest(
        sample_id="u_0", data={"prompt": "Play."}
    ))  # fmt: skip
    assert played.response.stop_reason == "env_error"
    assert "reset: OpenEnvError: http://127.0.0.1:9/schema: URLError" in (
        played.response.error or ""
    )
    told = load("openenv", url="http://127.0.0.1:9", action_field="message", timeout_seconds=1)
    with pytest.raises(OpenEnvError, match="cannot open a session at ws://127.0.0.1:9/ws"):
        told.reset(Record(id="gone"))  # a field given: no schema to read, straight to /ws


@pytest.mark.parametrize("command", ["records", "play"])
def test_env_commands_answer_a_server_they_cannot_reach_in_one_line(command: str) -> None:
    """Before, `mtrl env records` ended in a traceback when the server's /schema did not answer."""
    from typer.testing import CliRunner

    from mtrl.cli import app

    result = CliRunner().invoke(
        app, ["env", command, "openenv", "--arg", "url=http://127.0.0.1:9"], input="\n"
    )
    assert result.exit_code == 2, result.output
    assert "OpenEnvError: http://127.0.0.1:9/schema: URLError" in result.output
    assert "Traceback" not in result.output


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


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("silent", "step: TimeoutError"),
        ("babble", "step: JSONDecodeError"),
        ("state", "step: expected an observation, got 'state'"),
    ],
)
def test_a_misbehaving_server_is_an_env_error(reply: str, problem: str) -> None:
    with misbehaving_server() as url:
        environment = load("openenv", url=url, action_field="message", timeout_seconds=0.2)
        request = RolloutRequest(sample_id="m_0", data={"prompt": "Play."})
        response = play_rollout(environment, CallableModel(lambda _: reply), request).response
        assert response.stop_reason == "env_error" and problem in (response.error or "")


def test_a_reward_that_is_not_a_number_counts_as_none() -> None:
    with misbehaving_server() as url:
        episode, _ = load("openenv", url=url, action_field="message").reset(Record(id="n"))
        assert episode.step("nan").reward == 0.0
