"""A fake Kubernetes API server for tests: HTTPS with its own CA, bearer-token auth, and the
real paths, verbs, content types and status codes for apply / get / list / delete."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from lambdas.kubernetes.client import KubernetesClient
from mtrl.local.loopback import LoopbackHttpServer
from tests.json_http import send_json


def _self_signed() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return (
        certificate.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


class FakeKubernetes:
    """`objects[collection path][name]`; `accepted` tokens; `requests` as (method, path, content type).

    With `authenticate` (token -> user, or None), tokens are checked as EKS checks them, and
    `callers` holds (user, method, path) of every request.

    Deleting a namespace deletes what is in it; `terminating_reads[namespace]` keeps a deleted
    namespace readable (phase Terminating) for that many GETs, as finalizers do. `on_request`
    (method, path) runs before each request is served: the cluster's controllers, scripted.
    """

    def __init__(self, authenticate: Callable[[str], str | None] | None = None) -> None:
        # What every cluster starts with: objects go into a namespace that exists.
        self.objects: dict[str, dict[str, dict[str, Any]]] = {
            "/api/v1/namespaces": {
                name: {"metadata": {"name": name, "uid": name, "resourceVersion": "1"}}
                for name in ("default", "kube-system")
            }
        }
        self.accepted: set[str] = set()
        self.authenticate = authenticate
        self.requests: list[tuple[str, str, str]] = []
        self.callers: list[tuple[str, str, str]] = []
        self.terminating_reads: dict[str, int] = {}
        self._terminating: dict[str, int] = {}
        self.on_request: Callable[[str, str], None] | None = None
        self._uid = 0
        certificate, key = _self_signed()
        self.ca_data = base64.b64encode(certificate).decode()
        self._dir = tempfile.TemporaryDirectory()
        cert_file, key_file = Path(self._dir.name, "c.pem"), Path(self._dir.name, "k.pem")
        cert_file.write_bytes(certificate)
        key_file.write_bytes(key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_file, key_file)
        self._server = LoopbackHttpServer(self._handler(), name="fake-kubernetes")
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.endpoint = f"https://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeKubernetes:
        self._server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)
        self._dir.cleanup()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Api(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict[str, Any]) -> None:
                send_json(self, status, body)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._answer(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "reason": reason, "message": message, "code": code})  # fmt: skip

            def _serve(self) -> None:
                url = urlsplit(self.path)
                fake.requests.append(
                    (self.command, self.path, self.headers.get("Content-Type", ""))
                )
                if fake.on_request:
                    fake.on_request(self.command, url.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                token = self.headers.get("Authorization", "").removeprefix("Bearer ")
                user = fake.authenticate(token) if fake.authenticate else None
                if token not in fake.accepted and user is None:
                    self._status(401, "Unauthorized", "Unauthorized")
                    return
                if user is not None:
                    fake.callers.append((user, self.command, self.path))
                parts = url.path.rstrip("/").split("/")
                # /api/v1/[namespaces/NS/]PLURAL[/NAME] or /apis/GROUP/VERSION/[namespaces/NS/]PLURAL[/NAME]
                rest = parts[3:] if parts[1] == "api" else parts[4:]
                if rest and rest[0] == "namespaces" and len(rest) > 2:
                    rest = rest[2:]
                collection_length = len(parts) - len(rest) + 1
                collection = "/".join(parts[:collection_length])
                name = rest[1] if len(rest) > 1 else None
                items = fake.objects.setdefault(collection, {})
                if self.command == "PATCH":
                    if self.headers.get("Content-Type") != "application/apply-patch+yaml":
                        self._status(415, "UnsupportedMediaType", "apply needs apply-patch+yaml")
                        return
                    if "fieldManager" not in parse_qs(url.query):
                        self._status(422, "Invalid", "fieldManager is required for apply patch")
                        return
                    namespace = (
                        parts[parts.index("namespaces") + 1] if "namespaces" in parts[:-2] else None
                    )
                    if namespace and namespace not in fake.objects.get("/api/v1/namespaces", {}):
                        self._status(404, "NotFound", f'namespaces "{namespace}" not found')
                        return
                    stored = items.get(name)
                    if stored is None:
                        fake._uid += 1
                        stored = {
                            **body,
                            "metadata": {
                                **body["metadata"],
                                "uid": f"uid-{fake._uid}",
                                "resourceVersion": "1",
                                "creationTimestamp": datetime.datetime.now(datetime.UTC).strftime(
                                    "%Y-%m-%dT%H:%M:%SZ"
                                ),
                            },
                        }
                    else:
                        version = str(int(stored["metadata"]["resourceVersion"]) + 1)
                        stored = {
                            **stored,
                            **body,
                            "metadata": {
                                **stored["metadata"],
                                **body["metadata"],
                                "resourceVersion": version,
                            },
                        }
                    items[name] = stored
                    self._answer(200, stored)
                elif self.command == "GET" and name:
                    if collection == "/api/v1/namespaces" and fake._terminating.get(name):
                        fake._terminating[name] -= 1
                        self._answer(
                            200, {"metadata": {"name": name}, "status": {"phase": "Terminating"}}
                        )
                        return
                    if name not in items:
                        self._status(404, "NotFound", f'"{name}" not found')
                        return
                    self._answer(200, items[name])
                elif self.command == "GET":
                    wanted = dict(
                        pair.split("=", 1)
                        for pair in parse_qs(url.query).get("labelSelector", [""])[0].split(",")
                        if pair
                    )
                    found = [
                        obj for obj in items.values()
                        if all(obj["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
                    ]  # fmt: skip
                    self._answer(200, {"kind": "List", "items": found})
                elif self.command == "DELETE":
                    if items.pop(name, None) is None:
                        self._status(404, "NotFound", f'"{name}" not found')
                        return
                    if collection == "/api/v1/namespaces":
                        inside = f"/namespaces/{name}/"
                        for path in [p for p in fake.objects if inside in p]:
                            del fake.objects[path]
                        fake._terminating[name] = fake.terminating_reads.get(name, 0)
                    self._answer(200, {"kind": "Status", "status": "Success"})

            do_GET = do_PATCH = do_DELETE = _serve  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        return Api


# A bearer token the tests' API server accepts (`serving()`), for clients that need no EKS.
TOKEN = "k8s-aws-v1.valid"


@contextmanager
def serving() -> Iterator[FakeKubernetes]:
    """A fake API server that accepts TOKEN."""
    with FakeKubernetes() as fake:
        fake.accepted.add(TOKEN)
        yield fake


def client_of(api: FakeKubernetes) -> KubernetesClient:
    """Our client of `api`, with TOKEN and the server's CA."""
    return KubernetesClient(
        api.endpoint, token=lambda **_: TOKEN, certificate_authority=api.ca_data
    )
