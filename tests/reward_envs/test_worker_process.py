"""`python -m reward_envs.worker` as a process: SQS on moto's server, a model over HTTP, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import boto3
import pytest
from moto.server import ThreadedMotoServer

from domain.protocol import RolloutRequest, RolloutResponse, dump, parse

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class ChatCompletions(BaseHTTPRequestHandler):
    """An OpenAI-compatible model that always guesses CRANE."""

    calls = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["messages"][-1]["role"] == "user"
        ChatCompletions.calls += 1
        answer = json.dumps(
            {"choices": [{"message": {"role": "assistant", "content": "[crane]"}}]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def sqs_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def model_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ChatCompletions)
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def _environment(**extra: str) -> dict[str, str]:
    keep = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    return {**keep, **CREDENTIALS, **extra}


def test_worker_process_answers_then_stops_cleanly_on_sigterm(
    sqs_endpoint: str, model_url: str
) -> None:
    sqs = boto3.client(
        "sqs",
        endpoint_url=sqs_endpoint,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
    )
    urls = {
        name: sqs.create_queue(QueueName=f"p-{name}.fifo", Attributes={"FifoQueue": "true"})[
            "QueueUrl"
        ]
        for name in ("req", "resp", "dlq")
    }
    for index in range(5):
        request = RolloutRequest(sample_id=f"rec_{index}", data={"answer": "crane"})
        sqs.send_message(
            QueueUrl=urls["req"],
            MessageBody=dump(request),
            MessageGroupId=f"g{index}",
            MessageDeduplicationId=str(index),
        )
    process = subprocess.Popen(
        [sys.executable, "-m", "reward_envs.worker"],
        env=_environment(
            AWS_ENDPOINT_URL_SQS=sqs_endpoint,
            MTRL_ROLLOUT_REQUEST_QUEUE_URL=urls["req"],
            MTRL_ROLLOUT_RESPONSE_QUEUE_URL=urls["resp"],
            MTRL_DEAD_LETTER_QUEUE_URL=urls["dlq"],
            MTRL_MODEL_BASE_URL=model_url,
            MTRL_WAIT_SECONDS="1",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        responses: list[RolloutResponse] = []
        deadline = time.monotonic() + 60
        while len(responses) < 5 and time.monotonic() < deadline:
            for message in sqs.receive_message(
                QueueUrl=urls["resp"], MaxNumberOfMessages=10, WaitTimeSeconds=1
            ).get("Messages", []):
                responses.append(parse(RolloutResponse, message["Body"]))
                sqs.delete_message(QueueUrl=urls["resp"], ReceiptHandle=message["ReceiptHandle"])
        assert sorted(r.sample_id for r in responses) == [f"rec_{i}" for i in range(5)]
        assert all(r.aggregate_score == 1.0 for r in responses)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-2000:]
    assert "stopped: WorkerStats(completed=5" in stderr
    assert not sqs.receive_message(QueueUrl=urls["resp"], WaitTimeSeconds=0).get("Messages")


def _run_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The worker's process, with `env` as its environment, until it exits."""
    return subprocess.run(
        [sys.executable, "-m", "reward_envs.worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_worker_process_refuses_a_missing_setting_in_one_line() -> None:
    result = _run_worker(_environment())
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == ["reward worker: MTRL_ROLLOUT_REQUEST_QUEUE_URL: Field required"]


def test_worker_process_needs_run_credentials_for_the_router() -> None:
    env = _environment(
        MTRL_ROLLOUT_REQUEST_QUEUE_URL="https://sqs/q.fifo", MTRL_ROUTER_URL="https://router"
    )
    result = _run_worker(env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "reward worker: settings: router_url needs run_id and run_token (MTRL_RUN_ID, MTRL_RUN_TOKEN)"
    ]


def test_worker_process_needs_a_model() -> None:
    env = _environment(MTRL_ROLLOUT_REQUEST_QUEUE_URL="https://sqs/q.fifo")
    result = _run_worker(env)
    assert result.returncode == 2 and "set MTRL_ROUTER_URL" in result.stderr


def test_worker_process_refuses_environment_args_that_are_not_json_in_one_line() -> None:
    env = _environment(
        MTRL_ROLLOUT_REQUEST_QUEUE_URL="https://sqs/q.fifo", MTRL_ENVIRONMENT_ARGS="{url: nope"
    )
    result = _run_worker(env)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith('reward worker: error parsing value for field "environment_args"')
    assert "Expecting property name enclosed in double quotes" in line
