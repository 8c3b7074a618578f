"""moto's server in its own process, for benchmarks: this process's CPU time stays our own."""

from __future__ import annotations

import socket
import subprocess
import sys
import time


def moto_server() -> tuple[subprocess.Popen, str]:
    """moto's SQS in its own process, so this process's CPU time is the worker's alone
    (boto3 signing and HTTP included, as against AWS)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return server, url
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise RuntimeError("moto server did not start")
