"""The pipeline's polling Wait states, in local mode: each ends once the local compute planes
did something (or when its seconds are up), not a whole second after it.

Deployed, the state machine polls: WaitForNodes, WaitForWorkers, WaitForJob and the evaluations'
waits sleep `poll_seconds` before the next status call, since nothing tells the pipeline that a
HyperPod node came up or a job ended. Here the planes are local processes and threads that know
when they change, so they say so (`PlaneChanges.changed`), and a Wait that began after the last
change ends at the next one. The states taken are the same; only their timing is shorter (as
local mode already shortens Retry intervals): a status call after a Wait sees what changed, or
the same as before and the Wait comes again. A Wait of 0 seconds still does not wait.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import (
    WaitFunction,
)


class PlaneChanges:
    """A counter of what the local compute planes did, with a wait for the next change."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._count = 0

    def changed(self) -> None:
        with self._condition:
            self._count += 1
            self._condition.notify_all()

    def after(self, seen: int, *, seconds: float) -> int:
        """Return at once if there were changes since `seen` (a count this returned before),
        else at the next change or after `seconds`; the count now."""
        with self._condition:
            self._condition.wait_for(lambda: self._count > seen, timeout=seconds)
            return self._count


_ORIGINAL_WAIT = WaitFunction._wait_interval


@contextmanager
def waits_end_on(changes: PlaneChanges) -> Iterator[None]:
    """While active, a Wait state of any execution in this process ends at the first change
    since that execution's previous Wait ended (its first Wait: since this began), or after its
    seconds."""
    seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def wait_interval(self: WaitFunction, env: Any, wait_seconds: int) -> None:
        if wait_seconds > 0:
            seen[env] = changes.after(seen.get(env, 0), seconds=wait_seconds)

    WaitFunction._wait_interval = wait_interval  # type: ignore[method-assign]
    try:
        yield
    finally:
        WaitFunction._wait_interval = _ORIGINAL_WAIT  # type: ignore[method-assign]
