"""The in-process twin of the Redis failure tally: the LLM breakers of one process, on a
monotonic clock behind a lock. For embedded mode (one process) and tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kenning.pipeline.spend import Tally


@dataclass
class _Count:
    in_a_row: int = 0
    last: str = ""
    opened_at: float | None = None
    cooldown_s: float = 0.0


class MemoryFailureTally:
    """A `FailureTally` held by one process."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counts: dict[str, _Count] = {}
        self._lock = threading.Lock()

    def tally(self, key: str) -> Tally:
        with self._lock:
            count = self._counts.get(key, _Count())
            if count.opened_at is None:
                state = "closed"
            else:
                state = "open" if self._clock() - count.opened_at < count.cooldown_s else "half-open"
            return Tally(state, count.in_a_row, count.last)

    def failed(self, key: str, cause: str, failures: int, cooldown_s: float) -> bool:
        with self._lock:
            count = self._counts.setdefault(key, _Count())
            count.in_a_row += 1
            count.last = cause
            if count.in_a_row < failures:
                return False
            now = self._clock()
            if count.opened_at is not None and now - count.opened_at < count.cooldown_s:
                return False  # a request sent before it opened: it stays open no longer
            count.opened_at, count.cooldown_s = now, cooldown_s
            return True

    def succeeded(self, key: str) -> bool:
        with self._lock:
            count = self._counts.pop(key, None)
        return count is not None and count.opened_at is not None
