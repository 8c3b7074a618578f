"""Helpers for tests that run AWS code against moto."""

from __future__ import annotations

import threading
from typing import Any

from domain.tables import LEASE_KEY


def create_runs_table(dynamodb: Any, table_name: str) -> None:
    """The runs table as the pipeline stack declares it (tests/test_training_control.py pins
    both tables' keys against the template)."""
    _create(dynamodb, table_name, "run_id")


def create_leases_table(dynamodb: Any, table_name: str) -> None:
    """The capacity-leases table as the training control declares it."""
    _create(dynamodb, table_name, LEASE_KEY)


def _create(dynamodb: Any, table_name: str, key: str) -> None:
    dynamodb.create_table(
        TableName=table_name,
        KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def create_router_functions(lambda_client: Any, iam: Any) -> tuple[str, str]:
    """The router's consumer and rollout forwarder as moto functions: the consumer's name (a
    run's event source mapping wires to it) and the forwarder's ARN (a Nova run's
    `rollout_request_arn`)."""
    role = iam.create_role(RoleName="router", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    made = [
        lambda_client.create_function(
            FunctionName=name,
            Runtime="python3.12",
            Role=role,
            Handler=handler,
            Code={"ZipFile": b"code"},
        )
        for name, handler in (
            ("consumer", "lambdas.router.consumer.handler"),
            ("rollout-forwarder", "lambdas.router.rollout_forwarder.handler"),
        )
    ]
    return made[0]["FunctionName"], made[1]["FunctionArn"]


class Serialized:
    """A boto3 client whose calls take one process-wide lock: moto's in-memory backends are
    not thread-safe (concurrent FIFO receives lose or corrupt messages), AWS is."""

    _lock = threading.RLock()

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute) or name.startswith("_") or name in ("get_paginator", "meta"):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attribute(*args, **kwargs)

        return call


class Recorded:
    """A boto3 client whose requests are kept, in order, as (operation, parameters): for what
    moto accepts but does not keep (a stop's error and cause, a read's consistency)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if name in ("get_paginator", "meta", "exceptions"):
            return attribute

        def call(**kwargs: Any) -> Any:
            self.requests.append((name, kwargs))
            return attribute(**kwargs)

        return call

    def sent(self, operation: str) -> list[dict[str, Any]]:
        """The parameters of every `operation` request, in order."""
        return [params for name, params in self.requests if name == operation]
