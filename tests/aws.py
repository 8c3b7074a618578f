"""Helpers for tests that run AWS code against moto."""

from __future__ import annotations

import threading
from typing import Any


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
