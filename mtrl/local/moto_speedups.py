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

`install()` replaces them, process-wide and once, by cached versions of themselves. Nothing
else of moto is changed; answers are identical (tests/local/test_moto_speedups.py).
"""

from __future__ import annotations

import functools
import sys
import threading

import moto.core.responses
import moto.core.utils

_installed = threading.Lock()
_done: list[bool] = []


def install() -> None:
    """Put the cached lookups in place (idempotent)."""
    with _installed:
        if _done:
            return
        for name, size in (("camelcase_to_underscores", 8192), ("utcfromtimestamp", 1024)):
            _cache_everywhere(name, size)
        moto.core.responses.method_names_from_class = functools.cache(
            moto.core.utils.method_names_from_class
        )
        _done.append(True)


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
