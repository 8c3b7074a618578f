"""Embedded AWS for local mode: moto's server on loopback, serving this process and its children.

- moto's in-memory backends are not thread-safe (a delete racing a send loses FIFO messages),
  so requests are served one at a time; SQS long polls wait outside that lock and retry as
  short polls when their queue may have changed, so a waiting receiver never blocks everyone
  else. That one core is the run's speed limit: moto's pure lookups are memoized
  (moto_speedups.py) and a host's service is resolved once.
- Lambda invocations (from Step Functions) are not serialized: the handler they run calls back
  into this server. They are dispatched in-process to the real handlers (embedded.py).
- SQS event source mappings are run as Lambda runs them, by a poller per mapping that invokes
  the function with batches (moto would invoke inside the sending request).

Clients (boto3, in this process and in child processes given `LocalAws.environment()`) find
the server through `AWS_ENDPOINT_URL`; credentials are dummies. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import functools
import gc
import io
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import boto3
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.config import Config
from moto.awslambda.models import LambdaBackend
from moto.core.botocore_stubber import MockRawResponse
from moto.core.config import default_user_config
from moto.core.exceptions import HTTPException
from moto.core.request import normalize_request
from moto.dynamodb.responses import DynamoHandler
from moto.moto_api._internal.models import moto_api_backend
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.sqs.models import sqs_backends
from werkzeug.serving import make_server

from mtrl.local import moto_speedups
from mtrl.local.embedded import Dispatcher, in_process_lambdas, temporary_environ
from mtrl.local.loopback import SHUTDOWN_POLL_SECONDS
from mtrl.local.physical import ACCOUNT, REGION
from mtrl.local.sqs_event_source import SqsEventSource

log = logging.getLogger("mtrl.local.aws")

_INVOKE = re.compile(r"^/2015-03-31/functions/[^/]+/invocations$")
_RECEIVE = "AmazonSQS.ReceiveMessage"
# What can change what a queue's receivers get: new messages, visibility changed, a delete (in
# a FIFO queue it frees the next message of the group), and the queue itself deleted (its
# receivers end at once, as the event source pollers must when a run is torn down).
_WAKES_RECEIVERS = {
    "AmazonSQS.DeleteQueue",
    "AmazonSQS.PurgeQueue",
    "AmazonSQS.SendMessage",
    "AmazonSQS.SendMessageBatch",
    "AmazonSQS.ChangeMessageVisibility",
    "AmazonSQS.ChangeMessageVisibilityBatch",
    "AmazonSQS.DeleteMessage",
    "AmazonSQS.DeleteMessageBatch",
}
# A waiting receiver polls again after this even if nothing woke it (a visibility timeout or a
# delay that ran out wakes no one).
_RETRY_SHORT_POLL_SECONDS = 0.5
# The collector's thresholds while a process serves a run (`collector_tuned_for_serving`);
# bench/local.py measures a run with and without them.
GC_THRESHOLDS = (20_000, 50, 50)
# Services whose requests this process's own clients hand straight to moto's response class, as
# moto's in-process mock does: the router process's DynamoDB requests (a few per model turn) skip
# the WSGI environ and Flask's routing, ~11 % of each. One URL, one JSON protocol: nothing for
# Flask's routing to decide.
_HANDLERS: dict[str, Any] = {"dynamodb": DynamoHandler.dispatch}
_Answer = TypeVar("_Answer")
MOTO_CONFIG: dict[str, Any] = {
    "stepfunctions": {"execute_state_machine": True},
    "lambda": {"use_docker": False},
}


def call_wsgi(app: Any, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """One WSGI call, whole: status line, headers, body."""
    answer: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answer["status"], answer["headers"] = status, headers
        return lambda data: None

    chunks = app(environ, start_response)
    try:
        body = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    return answer["status"], answer["headers"], body


class _HostsResolvedOnce(DomainDispatcherApplication):
    """moto's dispatcher, remembering which service serves a host (it never changes)."""

    def __init__(self, create_app: Any) -> None:
        super().__init__(create_app)
        self._services: dict[str | None, Any] = {}

    def get_backend_for_host(self, host: str | None) -> Any:
        if host not in self._services:
            self._services[host] = super().get_backend_for_host(host)
        return self._services[host]


class _RequestHandler(MotoRequestHandler):
    # Buffered writes: status line, headers and body leave in one send, not one per line.
    wbufsize = 64 * 1024

    def run_wsgi(self) -> None:
        # A client that expects `100 Continue` (botocore, for every S3 PUT) holds its body back
        # until it comes or a second has passed: it must leave now, not with the response.
        if self.headers.get("Expect", "").lower().strip(" \t") == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.flush()
            del self.headers["Expect"]
        super().run_wsgi()


class SerializedApp:
    """The moto WSGI app, one request at a time (except Lambda invokes); SQS long polls emulated."""

    def __init__(self, app: Any) -> None:
        self._app = app
        self._lock = threading.Lock()
        # Per queue (by name), how many times something may have made messages receivable:
        # a waiting receiver wakes for its own queue only.
        self._changed = threading.Condition()
        self._changes: dict[str, int] = {}
        self.requests = 0

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if _INVOKE.match(environ.get("PATH_INFO", "")):
            return self._app(environ, start_response)
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        if target == _RECEIVE:
            return self._receive(environ, start_response)
        # The body is read before the lock is taken: a slow sender holds up only itself.
        raw = _body(environ)
        status, headers, body = self._serve(_with_body(environ, raw))
        if target not in _WAKES_RECEIVERS:
            start_response(status, headers)
            return [body]
        queue = _queue_name(raw)
        with self._changed:
            self._changes[queue] = self._changes.get(queue, 0) + 1
            self._changed.notify_all()
        start_response(status, headers)
        return [body]

    def _serve(self, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
        return self.serve(lambda: call_wsgi(self._app, environ))

    def serve(self, call: Callable[[], _Answer]) -> _Answer:
        """`call` served as one of this app's requests (under its lock)."""
        with self._lock:
            self.requests += 1
            return call()

    def _receive(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        raw = _body(environ)
        request = json.loads(raw or b"{}")
        queue = _queue_name(raw)
        deadline = time.monotonic() + float(request.get("WaitTimeSeconds") or 0)
        short_body = json.dumps({**request, "WaitTimeSeconds": 0}).encode()
        while True:
            with self._changed:
                seen = self._changes.get(queue, 0)
            status, headers, body = self._serve(_with_body(environ, short_body))
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not status.startswith("200") or b'"Messages"' in body:
                start_response(status, headers)
                return [body]
            with self._changed:
                self._changed.wait_for(
                    lambda seen=seen: self._changes.get(queue, 0) != seen,
                    timeout=min(remaining, _RETRY_SHORT_POLL_SECONDS),
                )


def _body(environ: dict[str, Any]) -> bytes:
    length = environ.get("CONTENT_LENGTH")
    if not length and environ.get("wsgi.input_terminated"):
        return environ["wsgi.input"].read()  # chunked: the server ends it at the last chunk
    return environ["wsgi.input"].read(int(length or 0))


def _with_body(environ: dict[str, Any], raw: bytes) -> dict[str, Any]:
    return {**environ, "wsgi.input": io.BytesIO(raw), "CONTENT_LENGTH": str(len(raw))}


def _queue_name(raw: bytes) -> str:
    """The queue a JSON-protocol SQS request names (by name: clients' URLs differ by host)."""
    try:
        url = json.loads(raw or b"{}").get("QueueUrl", "")
    except (ValueError, AttributeError):
        return ""
    return str(url).rsplit("/", 1)[-1]


class Poller(Protocol):
    """A running event source mapping (`SqsEventSource`, or one that polls in another process)."""

    @property
    def running(self) -> bool: ...

    def stop(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...


class PollerHost(Protocol):
    """Where a function's mappings are polled when it runs outside this process."""

    def poll(self, queue_url: str, batch_size: int) -> Poller: ...


class EventSourceMappings:
    """SQS → Lambda event source mappings, polled here as the Lambda service polls them, or by
    the host of a function that runs elsewhere (`elsewhere`, by function name)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._pollers: dict[str, Poller] = {}
        self._lock = threading.Lock()
        self.elsewhere: dict[str, PollerHost] = {}

    @property
    def active(self) -> int:
        with self._lock:
            pollers = list(self._pollers.values())
        # Asked outside the lock: a poller elsewhere answers over its process's channel.
        return sum(1 for poller in pollers if poller.running)

    @contextmanager
    def installed(self) -> Iterator[EventSourceMappings]:
        create, delete = (
            LambdaBackend.create_event_source_mapping,
            LambdaBackend.delete_event_source_mapping,
        )
        mappings = self

        def create_mapping(backend: LambdaBackend, spec: dict[str, Any]) -> Any:
            esm = create(backend, spec)
            queue = next(
                (
                    q
                    for q in sqs_backends[ACCOUNT][REGION].queues.values()
                    if q.queue_arn == esm.event_source_arn
                ),
                None,
            )
            if queue is not None:  # ours to poll, not moto's to invoke inside a send
                queue.lambda_event_source_mappings.pop(esm.function_arn, None)
                # Started outside this request: the poller's first call comes back to the server.
                threading.Thread(
                    target=mappings._start,
                    args=(esm.uuid, queue.name, esm.function_arn, int(esm.batch_size or 10)),
                    daemon=True,
                ).start()
            return esm

        def delete_mapping(backend: LambdaBackend, uuid: str) -> Any:
            with mappings._lock:
                poller = mappings._pollers.get(uuid)
            if poller is not None:  # outside this request: another process may be asked
                threading.Thread(target=poller.stop, daemon=True).start()
            return delete(backend, uuid)

        LambdaBackend.create_event_source_mapping = create_mapping  # type: ignore[method-assign]
        LambdaBackend.delete_event_source_mapping = delete_mapping  # type: ignore[method-assign]
        try:
            yield self
        finally:
            LambdaBackend.create_event_source_mapping = create  # type: ignore[method-assign]
            LambdaBackend.delete_event_source_mapping = delete  # type: ignore[method-assign]
            with self._lock:
                pollers, self._pollers = list(self._pollers.values()), {}
            for poller in pollers:
                poller.__exit__()

    def _start(self, uuid: str, queue_name: str, function: str, batch_size: int) -> None:
        sqs = boto3.client("sqs")
        url = sqs.get_queue_url(QueueName=queue_name)["QueueUrl"]
        host = self.elsewhere.get(function.rsplit(":", 1)[-1])
        if host is not None:
            with self._lock:
                self._pollers[uuid] = host.poll(url, batch_size)
            return
        poller = SqsEventSource(
            sqs,
            url,
            lambda event, _context: self._dispatcher.call(function, event),
            batch_size=batch_size,
            wait_seconds=1,
        )
        with self._lock:
            self._pollers[uuid] = poller
        poller.__enter__()


class MotoServer:
    """`with MotoServer() as server:` moto's server on 127.0.0.1 (a free port), its requests
    served one at a time (`SerializedApp`); `client(service)` reaches it from this process."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self.app = SerializedApp(_HostsResolvedOnce(create_backend_app))
        self.endpoint = ""

    def __enter__(self) -> MotoServer:
        moto_speedups.install()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        server = make_server(
            "127.0.0.1", 0, self.app, threaded=True, request_handler=_RequestHandler
        )
        thread = threading.Thread(
            target=server.serve_forever,
            args=(SHUTDOWN_POLL_SECONDS,),
            name="local-aws",
            daemon=True,
        )
        thread.start()
        self._stack.callback(thread.join, 10)
        self._stack.callback(server.server_close)
        self._stack.callback(server.shutdown)
        self.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def client(self, service: str) -> Any:
        """A client of this server for this process: requests go to the server's WSGI app
        directly (the same app, lock and backends), without a socket in between — or, for a
        service in `_HANDLERS`, straight to moto's handler."""
        client = local_client(service, self.endpoint)
        handler = _HANDLERS.get(service)
        send = (
            self._send_in_process
            if handler is None
            else functools.partial(self._send_to_handler, handler)
        )
        client.meta.events.register("before-send", send)
        return client

    def _send_to_handler(self, handler: Any, request: Any, **_: Any) -> AWSResponse:
        # As moto's own in-process mock (moto.core.botocore_stubber) hands a request over.
        normalized = normalize_request(request)

        def call() -> tuple[int, Any, Any]:
            try:
                return handler(normalized, normalized.raw_url, normalized.headers)
            except HTTPException as error:
                return error.code, error.get_headers(), error.get_body()

        status, headers, body = self.app.serve(call)
        return AWSResponse(request.url, status, headers, MockRawResponse(body))

    def _send_in_process(self, request: Any, **_: Any) -> AWSResponse:
        url = urlsplit(request.url)
        body = request.body or b""
        if isinstance(body, str):
            body = body.encode()
        elif hasattr(body, "read"):
            body = body.read()
        environ = {
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote(url.path),
            "QUERY_STRING": url.query,
            "SERVER_NAME": url.hostname or "127.0.0.1",
            "SERVER_PORT": str(url.port or 80),
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "wsgi.url_scheme": url.scheme,
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": io.StringIO(),
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "wsgi.version": (1, 0),
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_HOST": url.netloc,
        }
        for name, value in request.headers.items():
            value = value.decode() if isinstance(value, bytes) else value
            key = name.upper().replace("-", "_")
            if key == "CONTENT_TYPE":
                environ["CONTENT_TYPE"] = value
            elif key != "CONTENT_LENGTH":
                environ[f"HTTP_{key}"] = value
        status, headers, content = call_wsgi(self.app, environ)
        return AWSResponse(
            request.url,
            int(status.split(" ", 1)[0]),
            HTTPHeaders.from_pairs(headers),
            MockRawResponse(content),
        )


def local_client(service: str, endpoint: str) -> Any:
    """A client of the local server at `endpoint`, with connections for a run's many threads."""
    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name=REGION,
        config=Config(max_pool_connections=64),
    )


def local_credentials() -> dict[str, str]:
    """What a process needs to sign requests to a local server (and nothing real)."""
    return {
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_SESSION_TOKEN": "local",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


class LocalAws:
    """`with LocalAws() as aws:` moto's server on 127.0.0.1 (a free port), this process pointed
    at it. A service can be served by another local server instead (`serve_elsewhere`)."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self.server = MotoServer()
        self.app = self.server.app
        self.dispatcher: Dispatcher
        self.mappings: EventSourceMappings
        self._elsewhere: dict[str, str] = {}

    def __enter__(self) -> LocalAws:
        self._stack.enter_context(self.server)
        # The interpreter logs every failed state with its internals; the run report says it.
        logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
        # A fresh account each time (backends are process-wide); emptied again at the end.
        moto_api_backend.reset()
        self._stack.callback(moto_api_backend.reset)
        # A real profile must never be used against the fake.
        self._stack.enter_context(
            temporary_environ(
                self.environment() | {"MOTO_PORT": self.endpoint.rsplit(":", 1)[1]},
                remove=("AWS_PROFILE",),
            )
        )
        self._stack.enter_context(_moto_config(MOTO_CONFIG))
        self.dispatcher = self._stack.enter_context(in_process_lambdas())
        self.mappings = self._stack.enter_context(EventSourceMappings(self.dispatcher).installed())
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def serve_elsewhere(self, service: str, endpoint: str) -> None:
        """From now on `service` is the server at `endpoint`'s, for this process's clients (and
        its environment, which botocore reads) and for the processes given `environment()`."""
        self._elsewhere[service] = endpoint
        self._stack.enter_context(temporary_environ(_service_endpoints({service: endpoint})))

    def environment(self) -> dict[str, str]:
        """What a process needs to use this server (and nothing real)."""
        return (
            {"AWS_ENDPOINT_URL": self.endpoint}
            | local_credentials()
            | _service_endpoints(self._elsewhere)
        )

    def client(self, service: str) -> Any:
        """A client of this server (in-process), or of the server that serves `service`."""
        if service in self._elsewhere:
            return local_client(service, self._elsewhere[service])
        return self.server.client(service)


def _service_endpoints(endpoints: dict[str, str]) -> dict[str, str]:
    # botocore's per-service endpoint variable, which wins over AWS_ENDPOINT_URL.
    return {f"AWS_ENDPOINT_URL_{service.upper()}": url for service, url in endpoints.items()}


@contextmanager
def collector_tuned_for_serving() -> Iterator[None]:
    """Python's collector stopped a serving process for 9 % of a run (pauses up to 0.6 s)
    rescanning what lives all run long (moto, botocore's models, the deployment): what exists
    now is frozen out of its scans, and it runs less often (restored at the end)."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


@contextmanager
def _moto_config(config: dict[str, Any]) -> Iterator[None]:
    saved = {key: dict(default_user_config.get(key, {})) for key in config}  # type: ignore[call-overload]
    for key, values in config.items():
        default_user_config[key].update(values)  # type: ignore[literal-required]
    try:
        yield
    finally:
        for key, values in saved.items():
            default_user_config[key] = values  # type: ignore[literal-required]
