"""Every AWS API call made in this process, with who made it.

A principal is known by its credentials, as on AWS: each role the proof plays gets an access
key of its own (`credentials`, `session`), and a call is attributed to the key it was signed
with. Calls are recorded by botocore's event hooks on every client made while `installed`:
the API parameters as the code passed them, the answer or the error code AWS gave back.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3

from mtrl.local.embedded import function_session
from tests.service_fakes import every_client

SECRET = "proof-secret"
HARNESS = "harness"  # the tests' own setup and inspection, not a deployed principal


@dataclass(frozen=True)
class Call:
    principal: str
    service: str  # botocore's service name
    operation: str
    params: dict[str, Any]
    error: str | None  # the error code AWS answered with, if any
    response: dict[str, Any] | None

    def __str__(self) -> str:
        return f"{self.service}.{self.operation}"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._principals: dict[str, str] = {}
        self._lock = threading.Lock()

    def access_key(self, principal: str) -> str:
        key = "AKIA" + hashlib.sha256(principal.encode()).hexdigest()[:16].upper()
        with self._lock:
            self._principals[key] = principal
        return key

    def credentials(self, principal: str) -> dict[str, str]:
        """The environment variables that make a process (or a Lambda function) `principal`."""
        return {"AWS_ACCESS_KEY_ID": self.access_key(principal), "AWS_SECRET_ACCESS_KEY": SECRET}

    def session(self, principal: str, region: str = "us-east-1") -> boto3.Session:
        return function_session(
            aws_access_key_id=self.access_key(principal),
            aws_secret_access_key=SECRET,
            region_name=region,
        )

    def principal_of(self, access_key: str) -> str | None:
        return self._principals.get(access_key)

    @contextmanager
    def installed(self) -> Iterator[Recorder]:
        """Record the calls of every client created meanwhile (and of the default session)."""
        handlers = [
            ("before-parameter-build", self._parameters),
            ("before-call", self._caller),
            ("after-call", self._answered),
            ("after-call-error", self._failed),
        ]
        with every_client(handlers):
            yield self

    def record(self, access_key: str, service: str, operation: str, params: dict[str, Any]) -> None:
        """A request made other than through botocore (an HTTP call signed with SigV4)."""
        principal = self._principals.get(access_key, "anonymous")
        with self._lock:
            self.calls.append(Call(principal, service, operation, params, None, None))

    # --- botocore event handlers ---

    def _parameters(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["proof_params"] = _copied(params)

    def _caller(self, model: Any, request_signer: Any, context: dict[str, Any], **_: Any) -> None:
        context["proof_model"] = model
        credentials = request_signer._credentials  # the client's, as it signs with them
        key = credentials.get_frozen_credentials().access_key if credentials else ""
        context["proof_principal"] = self._principals.get(key, HARNESS if key else "anonymous")

    def _answered(
        self, parsed: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        error = parsed.get("Error", {}).get("Code") if isinstance(parsed, dict) else None
        self._record(model, context, error=error, response=None if error else parsed)

    def _failed(self, exception: Exception, context: dict[str, Any], **_: Any) -> None:
        if "proof_model" in context:  # a connection failure: the request may have been served
            self._record(
                context["proof_model"], context, error=type(exception).__name__, response=None
            )

    def _record(
        self, model: Any, context: dict[str, Any], *, error: str | None, response: Any
    ) -> None:
        if "proof_principal" not in context:
            return
        call = Call(
            principal=context["proof_principal"],
            service=model.service_model.service_name,
            operation=model.name,
            params=context.get("proof_params", {}),
            error=error,
            response=_copied(response) if isinstance(response, dict) else None,
        )
        with self._lock:
            self.calls.append(call)


def _copied(value: Any) -> Any:
    """Parameters and answers as data: a body being streamed is kept as its kind only."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_copied(item) for item in value]
    if value is None or isinstance(value, str | int | float | bool | bytes):
        return value
    try:
        return copy.deepcopy(value)
    except TypeError:
        return f"<{type(value).__name__}>"
