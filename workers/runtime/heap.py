"""Keep the garbage collector's full passes short in a process that runs a while.

A process that has imported kenning and opened its stores holds 100,000 and more objects
the cyclic garbage collector tracks (modules, classes, functions, the drivers' state), nearly
all alive until it exits. Every full collection goes over all of them: 50-100 ms, a pause
that lands in the middle of a query or a load batch (measured on the full 2Wiki store: a
search that took 45 ms took 130-160 ms when one ran). `settle` moves what the process holds
now out of those passes (`gc.freeze`), once per process; reference counting still frees any
of it that is dropped later, only cycles among it stay until the process ends.

It collects the young generations only before it freezes: a full collection is the very pass
it avoids, and it sits on the path of whatever calls it first (0.1 s at the start of a
cognify, for 20 unreachable objects in a heap of 140,000 after adding 200 documents).
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_settled = False


def settle() -> bool:
    """Collect the young generations' garbage, then leave every object tracked then (cycles
    already unreachable in the oldest generation too) out of later full collections. The first
    call in a process does it; later calls do nothing. Whether this call did it."""
    global _settled
    with _lock:
        if _settled:
            return False
        gc.collect(1)
        gc.freeze()
        _settled = True
        return True
