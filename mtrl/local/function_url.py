"""Serve a Lambda handler as a Function URL on loopback: HTTP in, payload-2.0 events, HTTP out.

Like a Function URL with AWS_IAM auth, it answers 403 to requests without a SigV4
Authorization header and passes the signer's access key to the handler as
`requestContext.authorizer.iam`; the signature itself is not verified (there is no IAM here).
It listens on 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from mtrl.local.loopback import LoopbackHttpServer

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]
_CREDENTIAL = re.compile(r"^AWS4-HMAC-SHA256 Credential=([^/]+)/")


class FunctionUrlServer:
    def __init__(self, handler: Handler, *, port: int = 0) -> None:
        self._handler = handler
        self._server = LoopbackHttpServer(self._request_handler(), name="function-url", port=port)

    @property
    def url(self) -> str:
        return self._server.url

    def __enter__(self) -> FunctionUrlServer:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    def _request_handler(self) -> type[BaseHTTPRequestHandler]:
        invoke = self._handler

        class Request(BaseHTTPRequestHandler):
            wbufsize = 64 * 1024  # headers and body in one send

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                signer = _CREDENTIAL.match(self.headers.get("Authorization", ""))
                if signer is None:
                    self._answer(403, {"Message": "Forbidden"})
                    return
                parts = urlsplit(self.path)
                try:
                    body, encoded = raw.decode(), False
                except UnicodeDecodeError:
                    body, encoded = base64.b64encode(raw).decode(), True
                event = {
                    "version": "2.0",
                    "rawPath": parts.path,
                    "rawQueryString": parts.query,
                    "headers": {key.lower(): value for key, value in self.headers.items()},
                    "body": body if raw else None,
                    "isBase64Encoded": encoded,
                    "requestContext": {
                        "http": {
                            "method": self.command,
                            "path": parts.path,
                            "sourceIp": self.client_address[0],
                        },
                        "authorizer": {"iam": {"accessKey": signer.group(1)}},
                        "timeEpoch": int(time.time() * 1000),
                    },
                }
                result = invoke(event, None)
                self._answer(
                    result.get("statusCode", 200), result.get("body", ""), result.get("headers", {})
                )

            def _answer(
                self, status: int, body: Any, headers: dict[str, str] | None = None
            ) -> None:
                data = (body if isinstance(body, str) else json.dumps(body)).encode()
                self.send_response(status)
                for key, value in (headers or {"content-type": "application/json"}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        return Request
