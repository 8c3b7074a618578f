"""A real MLflow tracking server for the tests: MLflow's own server application (the Flask app
`mlflow server` serves its REST API with), in a process of its own on 127.0.0.1, with a SQLite
store and the artifact root given. It stops when the block ends, and by itself when the test
process goes away (its standard input closes).

What it cannot be is SageMaker's: it checks no SigV4 signature and no IAM action; those are the
fake's (tests/mlflow_fake.py), held to SageMaker's and AWS's plugin's shapes.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlflow.server.constants import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR

START_SECONDS = 60  # importing MLflow and creating its tables on a loaded 2-core machine
# The server process: MLflow's app on a free loopback port, which it prints first; it exits when
# its standard input is closed.
_SERVE = """
import os, sys, threading
from werkzeug.serving import make_server
from mlflow.server import app
server = make_server("127.0.0.1", 0, app, threaded=True)
print(server.server_port, flush=True)
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
server.serve_forever()
"""


@contextmanager
def mlflow_server(directory: Path, *, artifact_root: str) -> Iterator[str]:
    """The server's URL while the block runs (its store and log in `directory`)."""
    environment = {
        **os.environ,
        BACKEND_STORE_URI_ENV_VAR: f"sqlite:///{directory / 'mlflow.db'}",
        ARTIFACT_ROOT_ENV_VAR: artifact_root,
    }
    log = (directory / "mlflow-server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-c", _SERVE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        env=environment,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{_port(process, directory)}"
        _wait_healthy(url, process, directory)
        yield url
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _port(process: subprocess.Popen[str], directory: Path) -> int:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=START_SECONDS):
            raise RuntimeError(f"no MLflow server after {START_SECONDS} s: {_log(directory)}")
    line = process.stdout.readline().strip()
    if not line.isdigit():
        raise RuntimeError(f"the MLflow server did not start: {_log(directory)}")
    return int(line)


def _wait_healthy(url: str, process: subprocess.Popen[str], directory: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the MLflow server exited: {_log(directory)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:  # noqa: S310
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the MLflow server at {url} was not healthy in {START_SECONDS} s")


def _log(directory: Path) -> str:
    return (directory / "mlflow-server.log").read_text()[-2000:]
