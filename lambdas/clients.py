"""What every Lambda entry point shares: one principal's AWS clients, made when first asked for
and kept for the container's life; and the entry points themselves, each handing its event to
handlers composed once from the function's environment as it was when the module loaded."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import boto3
from botocore.credentials import ReadOnlyCredentials

T = TypeVar("T")
Handler = Callable[[dict[str, Any]], Any]
Compose = Callable[[Mapping[str, str], "Clients"], Mapping[str, Handler]]


class Clients:
    """`clients("s3")`: the session's client for a service (with `options`, one per options)."""

    def __init__(self, session: boto3.Session) -> None:
        self._session = session
        self._made: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._lock = threading.Lock()  # making a client is not thread-safe; using one is

    def credentials(self) -> ReadOnlyCredentials:
        """The session's credentials now (its role's; refreshed as they expire), for requests
        signed by hand (SigV4 to an endpoint botocore has no client for)."""
        return self._session.get_credentials().get_frozen_credentials()

    def __call__(self, service: str, **options: str) -> Any:
        key = (service, tuple(sorted(options.items())))
        with self._lock:
            if key not in self._made:
                self._made[key] = self._session.client(service, **options)  # type: ignore[call-overload]
            return self._made[key]


def composed_once(
    make: Callable[[Mapping[str, str], Clients], T], environment: Mapping[str, str]
) -> Callable[[], T]:
    """`make(environment, clients)` at the first call, the same object after. Called as an entry
    module loads, with `os.environ`: the copy taken then is all the function ever reads."""
    environment = dict(environment)
    return functools.cache(lambda: make(environment, Clients(boto3.Session())))


def lambda_entries(
    compose: Compose, environment: Mapping[str, str]
) -> Callable[[str], Callable[[dict[str, Any], Any], Any]]:
    """`entry(name)`: the Lambda handler that runs `compose(environment, ...)[name]`, the
    handlers composed at the first invocation (`composed_once`)."""
    composed = composed_once(compose, environment)

    def entry(name: str) -> Callable[[dict[str, Any], Any], Any]:
        def handler(event: dict[str, Any], context: Any = None) -> Any:
            return composed()[name](event)

        handler.__name__ = handler.__qualname__ = name
        return handler

    return entry
