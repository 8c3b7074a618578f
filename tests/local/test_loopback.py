"""Local mode's HTTP stand-ins (the router's Function URL; the job runtime service is served the
same way, mtrl/local/loopback.py) keep every connection a busy run makes: none is dropped or
reset while the server is slow to accept."""

from __future__ import annotations

import socket
from contextlib import ExitStack
from urllib.parse import urlsplit

from mtrl.local.function_url import FunctionUrlServer

# More connections at once than a run makes: a reward worker plays up to 16 rollouts at a time,
# and socketserver's own backlog (5) reset some of them in local runs.
CONNECTIONS = 64


def _request(path: str, authorization: str) -> bytes:
    return f"GET {path} HTTP/1.0\r\nAuthorization: {authorization}\r\n\r\n".encode()


def _read_all(connection: socket.socket) -> bytes:
    chunks = []
    while chunk := connection.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _waiting_connections(url: str, authorization: str, stack: ExitStack) -> list[socket.socket]:
    """CONNECTIONS connections, each with its request sent, to a server not yet accepting (as
    when the run's main process holds the GIL). A connection the backlog cannot hold is not
    established: its connect times out."""
    address = urlsplit(url)
    connections = []
    for index in range(CONNECTIONS):
        connection = stack.enter_context(
            socket.create_connection((address.hostname, address.port), timeout=2)
        )
        connection.sendall(_request(f"/{index}", authorization))
        connections.append(connection)
    return connections


def test_the_function_url_answers_every_connection_that_waited_for_it() -> None:
    server = FunctionUrlServer(lambda event, _: {"statusCode": 200, "body": event["rawPath"]})
    signed = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261207/us-east-1/lambda/aws4_request"
    with ExitStack() as stack:
        connections = _waiting_connections(server.url, signed, stack)
        with server:
            answers = [_read_all(connection) for connection in connections]
    assert [answer.split(b"\r\n", 1)[0] for answer in answers] == [b"HTTP/1.0 200 OK"] * CONNECTIONS
    assert [answer.rsplit(b"\r\n\r\n", 1)[1] for answer in answers] == [
        f"/{index}".encode() for index in range(CONNECTIONS)
    ]
