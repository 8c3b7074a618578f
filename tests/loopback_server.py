"""A server someone else wrote, run by the tests in a process of its own on 127.0.0.1: it
listens on a free port, prints it first, and exits when its standard input closes (when the
block ends, or the test process goes away).

`script` is the Python that serves; it is given `serve(app)` to call with its app (ASGI or
WSGI, `kind`), which binds the port and prints it.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

START_SECONDS = 60  # imports and first tables on a loaded 2-core machine
_SERVE = {
    "wsgi": """
import os, sys, threading
from werkzeug.serving import make_server
def serve(app):
    server = make_server("127.0.0.1", 0, app, threaded=True)
    print(server.server_port, flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    server.serve_forever()
""",
    "asgi": """
import os, socket, sys, threading
import uvicorn
def serve(app):
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    print(listening.getsockname()[1], flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listening])
""",
}


@contextmanager
def loopback_server(
    script: str,
    directory: Path,
    *,
    kind: Literal["wsgi", "asgi"],
    health: str = "/health",
    environment: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """The server's base URL while the block runs; its log in `directory`."""
    log_path = directory / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", _SERVE[kind] + script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, **(environment or {})},
            text=True,
        )
        try:
            url = f"http://127.0.0.1:{_port(process, log_path)}"
            _wait_healthy(url + health, process, log_path)
            yield url
        finally:
            assert process.stdin is not None
            process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _port(process: subprocess.Popen[str], log: Path) -> int:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=START_SECONDS):
            raise RuntimeError(f"no server after {START_SECONDS} s: {_tail(log)}")
    line = process.stdout.readline().strip()
    if not line.isdigit():
        raise RuntimeError(f"the server did not start: {_tail(log)}")
    return int(line)


def _wait_healthy(url: str, process: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)  # a bounded poll: the deadline above ends it
    raise RuntimeError(f"{url} did not answer 200 in {START_SECONDS} s: {_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text()[-2000:]
