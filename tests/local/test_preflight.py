"""`mtrl local FILE --model-endpoint URL`: rollouts against an OpenAI-compatible server, no
training; the reward spread and the share of groups GRPO could not learn from."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mtrl.cli import app

EXAMPLE = Path(__file__).parents[2] / "examples" / "wordle" / "train.jsonl"


def _server(reply: str) -> ThreadingHTTPServer:
    """An OpenAI-compatible chat server that always answers `reply`, recording the requests."""

    class Chat(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.server.requests.append((self.path, body))  # type: ignore[attr-defined]
            data = json.dumps(
                {"choices": [{"message": {"role": "assistant", "content": reply}}]}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    server.requests = []  # type: ignore[attr-defined]
    return server


@pytest.fixture
def always_crane() -> Iterator[ThreadingHTTPServer]:
    server = _server("[crane]")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_model_that_always_says_the_same_has_no_signal(
    tmp_path: Path, always_crane: ThreadingHTTPServer
) -> None:
    endpoint = f"http://127.0.0.1:{always_crane.server_address[1]}/v1"
    result = CliRunner().invoke(
        app,
        [
            "local", str(EXAMPLE), "--model-endpoint", endpoint, "--model", "my-model",
            "--records", "3", "--config", "rft_multiturn_lora", "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (report_file,) = tmp_path.glob("preflight-*/report.json")
    report = json.loads(report_file.read_text())
    # 3 records x 8 rollouts; "crane" repeated is invalid from the second guess on, so every
    # rollout of a record ends the same way: no group has any spread.
    assert report["rollouts"] == 24 and report["scored"] == 24
    assert report["zero_variance_groups"] == 1.0
    assert "most groups have no reward spread" in result.output
    path, body = always_crane.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "my-model"
    assert body["messages"][0]["role"] == "user"


def test_an_unreachable_endpoint_is_an_error_not_a_zero(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "local", str(EXAMPLE), "--model-endpoint", "http://127.0.0.1:9/v1",
            "--records", "1", "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "no rollout got a reward" in result.output and "cannot reach" in result.output
