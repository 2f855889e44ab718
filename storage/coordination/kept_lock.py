"""A run lock held by one process for as long as it wants: kept alive while held.

A run lock in Redis expires unless its holder extends it (a dead holder must not keep a dataset
forever). Celery tasks extend it as they go; a process that holds it around a block of its own
(an embedded-style run, a forget) has this keep it, on a thread, until it lets go.
"""

from __future__ import annotations

import contextlib
import threading
import uuid

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.ports import RunLock

# The lock is extended this many times per ttl: a missed extension or two still leaves it held.
KEEPS_PER_TTL = 3


class KeptRunLock:
    """Implements `kenning.pipeline.ports.Lock` over a `RunLock`: an acquired lock is extended every
    `ttl_s / KEEPS_PER_TTL` until released. The holder's process dying stops the extensions, so
    the lock then expires after its ttl."""

    def __init__(self, lock: RunLock) -> None:
        self._lock = lock
        self._kept: dict[tuple[str, int], threading.Event] = {}
        self._mutex = threading.Lock()

    def acquire(self, name: str, ttl_s: float) -> int | None:
        holder = f"lock-{uuid.uuid4().hex}"
        token = self._lock.take(name, holder, ttl_s)
        if token is None:
            return None
        stop = threading.Event()
        with self._mutex:
            self._kept[(name, token)] = stop
        keeper = threading.Thread(
            target=self._keep, args=(name, holder, ttl_s, stop), name="kenning-lock-keep", daemon=True
        )
        keeper.start()
        return token

    def release(self, name: str, token: int) -> None:
        with self._mutex:
            stop = self._kept.pop((name, token), None)
        if stop is not None:
            stop.set()
        self._lock.release(name, token)

    def holder(self, name: str) -> int | None:
        """The token the lock is held under, or None when it is free."""
        return self._lock.holder(name)

    def _keep(self, name: str, holder: str, ttl_s: float, stop: threading.Event) -> None:
        while not stop.wait(ttl_s / KEEPS_PER_TTL):
            with contextlib.suppress(TransientStoreError):  # Redis away a moment: the next try
                if self._lock.keep(name, holder, ttl_s) is None:
                    return  # lost (expired and taken): nothing left to keep
