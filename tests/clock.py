"""A clock that moves only when a test moves it, for the twins that take one."""

from __future__ import annotations

import threading


class FakeClock:
    """Seconds on a clock of the test's own: `advance` moves it, and so does `sleep` (a twin that
    waits, waits no real time). Thread-safe."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += max(0.0, seconds)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)
