"""A server that misbehaves as no real OpenEnv server does (the real ones are in
openenv_servers.py): it speaks the `/ws` session protocol of meta-pytorch/OpenEnv
(`http_server.py`, `types.py`) for a reset, and answers a step by the step's `message`:
`"silent"` gets no answer, `"babble"` an answer that is not JSON, `"state"` an answer of another
type, `"nan"` an observation whose reward is not a number; anything else an observation.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

_OBSERVATION = {"observation": {"hint": "?"}, "reward": 0.0, "done": False}
_ANSWERS = {
    "babble": "<html>bad gateway</html>",
    "state": json.dumps({"type": "state", "data": {"step_count": 1}}),
    "nan": json.dumps({"type": "observation", "data": {**_OBSERVATION, "reward": float("nan")}}),
}


def _handle(connection: ServerConnection) -> None:
    try:
        for raw in connection:
            message = json.loads(raw)
            if message.get("type") == "close":
                return
            asked = (message.get("data") or {}).get("message")
            if asked == "silent":
                continue
            default = json.dumps({"type": "observation", "data": _OBSERVATION})
            connection.send(_ANSWERS.get(asked, default))
    except ConnectionClosed:
        return


@contextmanager
def misbehaving_server() -> Iterator[str]:
    """Its base URL on loopback; stopped on the way out."""
    with serve(_handle, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        host, port = server.socket.getsockname()[:2]
        try:
            yield f"http://{host}:{port}"
        finally:
            server.shutdown()
            thread.join(timeout=5)
