"""A run's router under moto: its queues, the conversation table, the proxy and the consumer."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
import pytest

from domain.protocol import GenerateRequest
from domain.run_queues import RunQueues, create_run_queues
from lambdas.router.consumer import Consumer
from lambdas.router.conversations import ConversationStore, create_table
from lambdas.router.proxy import Proxy
from local_trainer.scripted import ScriptedTrainer
from mtrl.local.function_url import FunctionUrlServer
from mtrl.local.sqs_event_source import SqsEventSource
from tests.aws import Serialized

TABLE = "conversations"
RUN, TOKEN = "run-1", "secret-token-1"
OTHER_RUN, OTHER_TOKEN = "run-2", "secret-token-2"
MODEL = "nova-lite-2"
GUESSES = ["[slate]", "[moist]", "[crane]"]  # the secret is CRANE: three turns each


def scripted_guess(request: GenerateRequest) -> str:
    """The n-th turn of a conversation gets the n-th scripted guess."""
    return GUESSES[sum(1 for m in request.messages if m.role == "assistant")]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Router:
    sqs: Any
    db: Any
    store: ConversationStore
    queues: RunQueues
    other_queues: RunQueues
    proxy: Proxy
    consumer: Consumer
    clock: Clock

    def messages(self, url: str) -> list[dict[str, Any]]:
        found = []
        while batch := self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"]
        ).get("Messages"):
            found += batch
            for message in batch:
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return found

    @contextmanager
    def serving(
        self,
        *,
        wait_seconds: float,
        reply: Callable[[GenerateRequest], str | dict[str, Any]] | None = None,
    ) -> Iterator[tuple[FunctionUrlServer, ScriptedTrainer]]:
        """The run's router at work: a proxy behind a Function URL on loopback, a scripted
        trainer answering generate requests with `reply` (default `scripted_guess`), and the
        consumer fed by the generate-responses queue. The trainer is stopped on the way out."""
        proxy = Proxy(self.store, self.sqs, wait_seconds=wait_seconds)
        trainer = ScriptedTrainer(
            self.sqs,
            requests_url=self.queues.generate_requests,
            responses_url=self.queues.generate_responses,
            reply=reply or scripted_guess,
        )
        with (
            FunctionUrlServer(lambda event, _context: proxy.handle(event)) as url,
            SqsEventSource(
                self.sqs,
                self.queues.generate_responses,
                lambda event, _context: self.consumer.handle(event),
                wait_seconds=0,
            ),
        ):
            trainer.start()
            try:
                yield url, trainer
            finally:
                trainer.stop.set()
                trainer.join(timeout=10)

    def queue_arn(self, url: str) -> str:
        return self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]


def event(
    method: str,
    path: str,
    body: Any = None,
    *,
    run: str | None = RUN,
    token: str | None = TOKEN,
    sample: str | None = None,
    signed: bool = True,
) -> dict[str, Any]:
    """A Function URL event for `path` under the run's base URL (`/runs/<run>/<token>`; a bare
    `path` when `run` is None, and no token segment when `token` is None), with `sample` as the
    body's `sample_id` when the body is an object."""
    if sample is not None and isinstance(body, dict):
        body = {**body, "sample_id": sample}
    if run is not None:
        path = "/runs/" + "/".join(part for part in (run, token) if part is not None) + path
    context: dict[str, Any] = {"http": {"method": method, "path": path}}
    if signed:
        context["authorizer"] = {"iam": {"accessKey": "AKIDEXAMPLE"}}
    return {
        "version": "2.0",
        "rawPath": path,
        "headers": {"content-type": "application/json"},
        "body": body if isinstance(body, str) or body is None else json.dumps(body),
        "isBase64Encoded": False,
        "requestContext": context,
    }


def answer(result: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return result["statusCode"], json.loads(result["body"])


@pytest.fixture
def router(aws: None) -> Router:
    sqs, db = Serialized(boto3.client("sqs")), Serialized(boto3.client("dynamodb"))
    create_table(db, TABLE)
    clock = Clock()
    store = ConversationStore(db, TABLE)
    queues = create_run_queues(sqs, prefix="test", run_id=RUN)
    other = create_run_queues(sqs, prefix="test", run_id=OTHER_RUN)
    store.put_run(RUN, token=TOKEN, queues=queues.urls(), model=MODEL, now=clock())
    store.put_run(OTHER_RUN, token=OTHER_TOKEN, queues=other.urls(), model=MODEL, now=clock())
    proxy = Proxy(store, sqs, wait_seconds=0, clock=clock, sleep=clock.sleep)
    return Router(sqs, db, store, queues, other, proxy, Consumer(store, clock=clock), clock)
