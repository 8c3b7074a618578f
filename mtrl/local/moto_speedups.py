"""Memoized lookups for moto's server: the same answers, computed once.

Local mode sends every AWS request of a run (thousands per training step) through one moto
server, serialized on one core, so moto's per-request overhead is the demo's speed limit.
Profiling a run (yappi, 2 cores) put pure lookups near the top, each recomputed on every
request although its answer never changes within a process:

- `camelcase_to_underscores`: SQS rebuilds a queue's attribute map, converting each name,
  several times per message;
- `method_names_from_class`: every request lists its response class's methods (inspect);
- `utcfromtimestamp`: SQS asks whether each message of a queue is visible, and whether it is
  delayed, several times per request, and every asking works out the epoch anew
  (`unix_time`'s `utcfromtimestamp(0)`, ~4% of a run's main-process CPU).

(The third, finding a host's service by listing moto's package directory, is answered once per
host by local mode's dispatcher, `_HostsResolvedOnce` in aws.py.)

`install()` replaces them, process-wide and once, by cached versions of themselves. And one
property that did work nobody asked for: an SQS queue's `attributes` worked out every attribute,
the three message counts included (each a pass over the queue's messages, reading the clock per
message), where its callers read one (`ContentBasedDeduplication` four times per FIFO send,
`MessageRetentionPeriod` three times per message considered by a receive: quadratic in the
queue's length). `QueueAttributes` gives the same mapping, each attribute worked out when read.
Nothing else of moto is changed; answers are identical (tests/local/test_moto_speedups.py).
"""

from __future__ import annotations

import functools
import json
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import moto.core.responses
import moto.core.utils
from moto.sqs.models import Queue

_installed = threading.Lock()
_done: list[bool] = []


def install() -> None:
    """Put the cached lookups and the queue attributes worked out when read in place
    (idempotent)."""
    with _installed:
        if _done:
            return
        for name, size in (("camelcase_to_underscores", 8192), ("utcfromtimestamp", 1024)):
            _cache_everywhere(name, size)
        moto.core.responses.method_names_from_class = functools.cache(
            moto.core.utils.method_names_from_class
        )
        Queue.attributes = property(QueueAttributes)  # type: ignore[assignment,method-assign]
        _done.append(True)


# moto's own, for the tests that hold the two side by side.
ORIGINAL_QUEUE_ATTRIBUTES = Queue.attributes.fget


class QueueAttributes(Mapping[str, Any]):
    """An SQS queue's attributes as moto's `Queue.attributes` gives them (the same names in the
    same order, the same values), each worked out when read."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        names = list(queue.BASE_ATTRIBUTES)  # Policy and RedrivePolicy among them
        if queue.fifo_queue:
            names += queue.FIFO_ATTRIBUTES
        if queue.kms_master_key_id:  # type: ignore[attr-defined]
            names += queue.KMS_ATTRIBUTES
        self._names = dict.fromkeys(names)

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        if name == "RedrivePolicy" and self._queue.redrive_policy:
            return json.dumps(self._queue.redrive_policy)
        value = getattr(self._queue, moto.core.utils.camelcase_to_underscores(name))
        return str(value).lower() if isinstance(value, bool) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _cache_everywhere(name: str, size: int) -> None:
    """moto.core.utils' function `name`, cached, wherever moto calls it by that name."""
    original = getattr(moto.core.utils, name)
    cached = functools.lru_cache(maxsize=size)(original)
    # Modules imported later take the name from moto.core.utils; those already imported hold
    # the original under their own name.
    setattr(moto.core.utils, name, cached)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("moto.") and vars(module).get(name) is original:
            setattr(module, name, cached)
