"""Memoized lookups for moto's server: the same answers, computed once.

Local mode sends every AWS request of a run (thousands per training step) through one moto
server, serialized on one core, so moto's per-request overhead is the demo's speed limit.
Profiling a run (yappi, 2 cores) put pure lookups near the top, each recomputed on every
request although its answer never changes within a process:

- `camelcase_to_underscores`: SQS rebuilds a queue's attribute map, converting each name,
  several times per message;
- `method_names_from_class`: every request lists its response class's methods (inspect).

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
        original = moto.core.utils.camelcase_to_underscores
        cached = functools.lru_cache(maxsize=8192)(original)
        # Modules imported later take the name from moto.core.utils; those already imported
        # hold the original under their own name.
        moto.core.utils.camelcase_to_underscores = cached
        for name, module in list(sys.modules.items()):
            if (
                name.startswith("moto.")
                and vars(module).get("camelcase_to_underscores") is original
            ):
                module.camelcase_to_underscores = cached
        moto.core.responses.method_names_from_class = functools.cache(
            moto.core.utils.method_names_from_class
        )
        _done.append(True)
