"""The worker's OpenAI-compatible client against a real HTTP server on 127.0.0.1: what it
sends, and each way an answer fails — the server's own message in the error, the proxy's 410
as a closed phase, a body that is not JSON, no answer in time — as the one mapping the router's
client shares (`answer_of`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from reward_envs.worker.model_client import (
    ModelError,
    ModelTimeout,
    OpenAICompatibleClient,
    PhaseClosed,
)

COMPLETION = {"choices": [{"message": {"role": "assistant", "content": "[crane]"},
                           "finish_reason": "stop"}]}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]


class _Server(ThreadingHTTPServer):
    received: list[dict[str, Any]]
    released: threading.Event


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers["Content-Length"])
        self.server.received.append(json.loads(self.rfile.read(length)))
        case = self.path.split("/")[1]
        if case == "slow":
            self.server.released.wait(10)  # until the test is done with it
        status, body = {
            "ok": (200, json.dumps(COMPLETION).encode()),
            "error": (503, b'{"error": {"message": "overloaded", "type": "server"}}'),
            "gone": (410, b'{"error": {"message": "phase closed"}}'),
            "babble": (200, b"<html>not json</html>"),
            "slow": (200, json.dumps(COMPLETION).encode()),
        }[case]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        """Quiet."""


@pytest.fixture
def server() -> Iterator[_Server]:
    serving = _Server(("127.0.0.1", 0), _Handler)
    serving.received, serving.released = [], threading.Event()
    thread = threading.Thread(target=serving.serve_forever, daemon=True)
    thread.start()
    yield serving
    serving.released.set()
    serving.shutdown()
    thread.join(timeout=10)


def _client(server: _Server, case: str) -> OpenAICompatibleClient:
    port = server.server_address[1]
    return OpenAICompatibleClient(f"http://127.0.0.1:{port}/{case}", "policy", max_tokens=64)


def _chat(server: _Server, case: str, timeout: float = 5.0) -> Any:
    return _client(server, case).chat(
        [{"role": "user", "content": "guess"}], sample_id="s_0", step_id="s_0/1",
        timeout=timeout, tools=TOOLS,
    )  # fmt: skip


def test_a_turn_is_asked_with_the_conversation_tools_and_limits(server: _Server) -> None:
    turn = _chat(server, "ok")
    assert turn.message == {"role": "assistant", "content": "[crane]"}
    assert turn.finish_reason == "stop"
    assert server.received == [{"messages": [{"role": "user", "content": "guess"}],
                                "model": "policy", "max_tokens": 64, "user": "s_0",
                                "tools": TOOLS}]  # fmt: skip


def test_each_failure_says_what_and_where(server: _Server) -> None:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with pytest.raises(ModelError) as failed:
        _chat(server, "error")
    assert str(failed.value) == f"s_0/1: HTTP 503 from {url}/error/chat/completions: overloaded"
    with pytest.raises(PhaseClosed, match="phase closed"):
        _chat(server, "gone")
    with pytest.raises(ModelError, match="is not JSON"):
        _chat(server, "babble")
    with pytest.raises(ModelTimeout, match="no reply within 0.2 s"):
        _chat(server, "slow", timeout=0.2)
