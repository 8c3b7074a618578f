"""The HTTP server under local mode's stand-ins (the Function URL, the job runtime service): on
127.0.0.1 only, a thread per request, served from a thread of its own while entered."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# How often a serving loop looks for a shutdown: socketserver's 0.5 s made every local session's
# end wait up to half a second per server (three of them); twenty cheap wake-ups a second do not.
SHUTDOWN_POLL_SECONDS = 0.05


class LoopbackHttpServer(ThreadingHTTPServer):
    """Listens from construction (its port is known at once); answers while entered."""

    daemon_threads = True
    # socketserver's backlog is 5: a reward worker's concurrent rollouts overflowed it while the
    # run's main process held the GIL, and the kernel reset their connections (a rollout failed
    # outside its episode, retried seconds later). Servers made for the job (werkzeug, uvicorn)
    # listen with a backlog of 128 and more.
    request_queue_size = socket.SOMAXCONN

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, name: str, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), handler)
        self._thread = threading.Thread(
            target=self.serve_forever, args=(SHUTDOWN_POLL_SECONDS,), name=name, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LoopbackHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():  # shutdown() waits for a loop that never started
            self.shutdown()
        self.server_close()
        self._thread.join(timeout=10)
