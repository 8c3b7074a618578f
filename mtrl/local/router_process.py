"""The router and DynamoDB in a process of their own, so that a local run uses two cores.

In local mode one process serves every AWS request of a run, serialized on one core, and the
router was most of its work: per model turn the proxy reads and writes the conversation table
three times and sends to SQS, and the consumer's poller receives, updates and deletes
(bench/local.py measures it). Here the proxy's Function URL, the consumer's event source
pollers and the DynamoDB they share (moto, every table of the deployment) run beside the main
process, which keeps SQS and the rest; the two meet over loopback HTTP as the services do.

The main process drives it through its stdin and stdout, one JSON line each way per command:
the first line out is `Ready` (where its DynamoDB and its Function URL listen); then `Route`
(once the pipeline is deployed: which table, which SQS), `Poll`/`Stop`/`Running` for the
consumer's mappings. It ends when its stdin closes: when the session ends, or its parent dies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from lambdas.router.consumer import Consumer
from lambdas.router.conversations import ConversationStore
from lambdas.router.proxy import Proxy
from mtrl.local.aws import (
    MotoServer,
    collector_tuned_for_serving,
    local_client,
    local_credentials,
)
from mtrl.local.function_url import FunctionUrlServer
from mtrl.local.sqs_event_source import SqsEventSource

log = logging.getLogger("mtrl.local.router")

# How long the proxy waits for a step's answer before answering "not yet" (the client polls on).
PROXY_WAIT_SECONDS = 5.0
# Bound on any one command, the start included (imports take ~1 s on 2 cores).
REPLY_SECONDS = 60.0


class RouterUnavailable(RuntimeError):
    """The router process ended, or fell silent, before it answered; the message ends with the
    last line of its log."""


class Ready(BaseModel):
    dynamodb: str
    router: str


class Route(BaseModel):
    op: Literal["route"] = "route"
    table: str
    sqs_endpoint: str


class Poll(BaseModel):
    op: Literal["poll"] = "poll"
    queue_url: str
    batch_size: int


class Stop(BaseModel):
    """Stop a poller after its current batch; `wait`: until it has ended."""

    op: Literal["stop"] = "stop"
    poller: int
    wait: bool = False


class Running(BaseModel):
    op: Literal["running"] = "running"
    poller: int


Command = Annotated[Route | Poll | Stop | Running, Field(discriminator="op")]
COMMAND: TypeAdapter[Route | Poll | Stop | Running] = TypeAdapter(Command)


class Reply(BaseModel):
    poller: int | None = None
    running: bool | None = None
    error: str | None = None


class StepSignals:
    """Completions announced to the proxy's waits (in one process nothing needs polling)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._completed: set[str] = set()

    def wait(self, step_id: str, seconds: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: step_id in self._completed, timeout=seconds)
            self._completed.discard(step_id)

    def completed(self, event: dict[str, Any]) -> None:
        """After the consumer handled `event` (an SQS batch of generate responses)."""
        steps = set()
        for record in event.get("Records", []):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                steps.add(json.loads(record["body"])["step_id"])
        with self._changed:
            self._completed |= steps
            self._changed.notify_all()


class Router:
    """The router's two functions over this process's DynamoDB (the child's side)."""

    def __init__(self, dynamodb: MotoServer) -> None:
        self._dynamodb = dynamodb
        self._signals = StepSignals()
        self._proxy: Proxy | None = None
        self._consumer: Consumer | None = None
        self._sqs: Any = None
        self._pollers: list[SqsEventSource] = []

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        for poller in self._pollers:
            poller.__exit__()

    def handle(self, event: dict[str, Any], _context: Any) -> dict[str, Any]:
        """The proxy's Function URL."""
        if self._proxy is None:
            return {"statusCode": 503, "body": {"message": "the router is not deployed yet"}}
        return self._proxy.handle(event)

    def command(self, line: str) -> Reply:
        try:
            request = COMMAND.validate_json(line)
        except ValidationError as error:
            return Reply(error=f"not a router command: {error}")
        if isinstance(request, Route):
            self._route(request)
            return Reply()
        if isinstance(request, Poll):
            return Reply(poller=self._poll(request))
        if not 0 <= request.poller < len(self._pollers):
            return Reply(error=f"no poller {request.poller}")
        poller = self._pollers[request.poller]
        if isinstance(request, Stop):
            poller.__exit__() if request.wait else poller.stop()
        return Reply(running=poller.running)

    def _route(self, route: Route) -> None:
        store = ConversationStore(self._dynamodb.client("dynamodb"), route.table)
        self._sqs = local_client("sqs", route.sqs_endpoint)
        self._consumer = Consumer(store)
        self._proxy = Proxy(
            store, self._sqs, wait_seconds=PROXY_WAIT_SECONDS, step_changes=self._signals.wait
        )

    def _poll(self, poll: Poll) -> int:
        if self._consumer is None:
            raise RuntimeError("a poller before the route")
        consume = self._consumer.handle

        def consume_then_signal(event: dict[str, Any], _context: Any) -> dict[str, Any]:
            try:
                return consume(event)
            finally:
                self._signals.completed(event)

        poller = SqsEventSource(
            self._sqs, poll.queue_url, consume_then_signal, batch_size=poll.batch_size,
            wait_seconds=1,
        )  # fmt: skip
        self._pollers.append(poller.__enter__())
        return len(self._pollers) - 1


def serve(commands: IO[str], replies: IO[str]) -> None:
    """The child: serve until `commands` ends."""

    def send(message: BaseModel) -> None:
        replies.write(message.model_dump_json(exclude_none=True) + "\n")
        replies.flush()

    with ExitStack() as stack:
        dynamodb = stack.enter_context(MotoServer())
        router = stack.enter_context(Router(dynamodb))
        url = stack.enter_context(FunctionUrlServer(router.handle))
        stack.enter_context(collector_tuned_for_serving())
        send(Ready(dynamodb=dynamodb.endpoint, router=url.url))
        for line in commands:
            try:
                send(router.command(line))
            except Exception as error:  # noqa: BLE001 - the parent gets the reason, not silence
                log.exception("command failed: %s", line.strip())
                send(Reply(error=f"{type(error).__name__}: {error}"))


class RemotePoller:
    """A consumer mapping's poller in the router process (the main process's handle on it)."""

    def __init__(self, process: RouterProcess, poller: int) -> None:
        self._process, self._poller = process, poller

    @property
    def running(self) -> bool:
        if self._process.ended:
            return False
        return bool(self._process.ask(Running(poller=self._poller)).running)

    def stop(self) -> None:
        if not self._process.ended:
            self._process.ask(Stop(poller=self._poller))

    def __exit__(self, *exc: object) -> None:
        if not self._process.ended:
            self._process.ask(Stop(poller=self._poller, wait=True))


class RouterProcess:
    """`with RouterProcess() as router:` the router process started (its start overlaps what the
    caller does next); `ready()` waits for it. Its log is kept in a temporary file until
    `save_log` copies it where the run's logs are."""

    MODULE = "mtrl.local.router_process"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: queue.Queue[str] = queue.Queue()
        self._ready: Ready | None = None
        self._stack = ExitStack()
        self._process: subprocess.Popen[str]
        self._log: IO[bytes]

    def __enter__(self) -> RouterProcess:
        self._log = self._stack.enter_context(tempfile.TemporaryFile())
        environment = {
            key: value for key, value in os.environ.items() if not key.startswith("AWS_")
        } | local_credentials()
        self._process = subprocess.Popen(
            [sys.executable, "-m", self.MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=environment,
            text=True,
        )
        self._stack.callback(self._end)
        threading.Thread(target=self._read, name="router-replies", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @property
    def ended(self) -> bool:
        """Its channel closed (its pollers ended with it)."""
        return self._process.stdin is None or self._process.stdin.closed

    def ready(self) -> Ready:
        if self._ready is None:
            self._ready = Ready.model_validate_json(self._next_line("start"))
        return self._ready

    def route(self, *, table: str, sqs_endpoint: str) -> None:
        self.ask(Route(table=table, sqs_endpoint=sqs_endpoint))

    def poll(self, queue_url: str, batch_size: int) -> RemotePoller:
        reply = self.ask(Poll(queue_url=queue_url, batch_size=batch_size))
        if reply.poller is None:
            raise RuntimeError(f"the local router named no poller for {queue_url}")
        return RemotePoller(self, reply.poller)

    def ask(self, command: BaseModel) -> Reply:
        self.ready()
        with self._lock:
            assert self._process.stdin is not None
            self._process.stdin.write(command.model_dump_json() + "\n")
            self._process.stdin.flush()
            reply = Reply.model_validate_json(self._next_line(command.model_dump()["op"]))
        if reply.error:
            raise RuntimeError(f"the local router refused {command!r}: {reply.error}")
        return reply

    def save_log(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self._logged())

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put("")  # it ended

    def _next_line(self, what: str) -> str:
        try:
            line = self._lines.get(timeout=REPLY_SECONDS)
            why = "it ended before answering"
        except queue.Empty:
            line, why = "", f"no answer within {REPLY_SECONDS:.0f} s"
        if not line:
            self._lines.put("")  # out of step, or ended: every later question fails too
            raise RouterUnavailable(
                f"the local router process ({self.MODULE}) failed at {what!r}: {why}; the last "
                f"line of its log: {self._last_log_line()}"
            )
        return line

    def _last_log_line(self) -> str:
        lines = [line for line in self._logged().decode(errors="replace").splitlines() if line]
        return lines[-1] if lines else "its log is empty"

    def _logged(self) -> bytes:
        """What it has logged so far."""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def _end(self) -> None:
        """Close its stdin (it stops its pollers and servers and exits); kill it if it does not."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def main() -> None:
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s"
    )
    replies, sys.stdout = sys.stdout, sys.stderr  # the channel is for replies only
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
