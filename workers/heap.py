"""Keep the garbage collector's full passes short in a process that runs a while.

A process that has imported kenning and opened its stores holds 100,000 and more objects
the cyclic garbage collector tracks (modules, classes, functions, the drivers' state), nearly
all alive until it exits. Every full collection goes over all of them: 50-100 ms, a pause
that lands in the middle of a query or a load batch (measured on the full 2Wiki store: a
search that took 45 ms took 130-160 ms when one ran). `settle` moves what the process holds
now out of those passes (`gc.freeze`), once per process; reference counting still frees any
of it that is dropped later, only cycles among it stay until the process ends.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_settled = False


def settle() -> bool:
    """Collect what is garbage now, then leave everything still alive out of later full
    collections. The first call in a process does it; later calls do nothing. Whether this
    call did it."""
    global _settled
    with _lock:
        if _settled:
            return False
        gc.collect()
        gc.freeze()
        _settled = True
        return True
