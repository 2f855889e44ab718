"""How many LLM calls to keep in flight: enough to reach the rate limit, no more.

By Little's law a provider admitting `rpm / 60` requests a second, each taking
`latency` seconds to answer, is kept busy by `rpm / 60 * latency` calls in flight.
Fewer leave part of the limit unused; more only queue at the rate limiter. The latency
is observed as calls are answered, so the number follows it as it changes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

# Calls in flight beyond Little's law: a slot's cycle is more than the latency observed (the
# pipeline's own work between calls, the limiter's wake-ups, latency varying from call to call).
# Calls beyond the limit's need only wait at the limiter, which admits no more than the limit.
HEADROOM = 1.5
# The weight of the newest observation in the moving average of latency.
SMOOTHING = 0.3
# What a call is assumed to take before any has been answered.
INITIAL_LATENCY_S = 1.0


def in_flight(rpm: int, latency_s: float, cap: int) -> int:
    """Calls to keep in flight under `rpm` requests a minute (0: no limit) when a call takes
    `latency_s` seconds: ceil(rpm / 60 * latency * HEADROOM), between 1 and `cap`."""
    if rpm <= 0:
        return cap
    return max(1, min(cap, math.ceil(rpm / 60 * latency_s * HEADROOM)))


@runtime_checkable
class Metered(Protocol):
    """A client that tells how long its answered requests took."""

    def answered(self) -> tuple[int, float]:
        """Requests answered so far, and the seconds they took in all (waits for admission excluded)."""
        ...


class Pacer:
    """The calls to keep in flight, following an exponential moving average of observed latency."""

    def __init__(self, rpm: int, cap: int, latency_s: float = INITIAL_LATENCY_S) -> None:
        self._rpm = rpm
        self._cap = cap
        self._latency_s = latency_s
        self._seen: tuple[int, float] | None = None
        self._mutex = threading.Lock()

    @property
    def latency_s(self) -> float:
        return self._latency_s

    @property
    def limit(self) -> int:
        return in_flight(self._rpm, self._latency_s, self._cap)

    def observe(self, calls: int, seconds: float) -> None:
        """`calls` more requests were answered, taking `seconds` in all."""
        if calls <= 0:
            return
        with self._mutex:
            self._latency_s += SMOOTHING * (seconds / calls - self._latency_s)

    def follow(self, client: Metered) -> None:
        """Observe what `client` answered since the previous call (the first only takes note)."""
        calls, seconds = client.answered()
        with self._mutex:
            seen, self._seen = self._seen, (calls, seconds)
        if seen is not None:
            self.observe(calls - seen[0], seconds - seen[1])


class Slots:
    """A gate of calls in flight shared by every thread of a process: as many as `pacer` allows
    at the latency it observes (`client`'s answers, followed as each call ends)."""

    def __init__(self, pacer: Pacer, client: Metered | None = None) -> None:
        self._pacer = pacer
        self._client = client
        self._busy = 0
        self._changed = threading.Condition()
        if client is not None:
            pacer.follow(client)

    @property
    def limit(self) -> int:
        return self._pacer.limit

    @property
    def busy(self) -> int:
        return self._busy

    @contextmanager
    def taken(self) -> Iterator[None]:
        """Hold a slot while the block runs; wait for one first when all are busy."""
        with self._changed:
            # Each slot is given back when its call ends, which its deadline bounds.
            self._changed.wait_for(lambda: self._busy < self._pacer.limit)
            self._busy += 1
        try:
            yield
        finally:
            if self._client is not None:
                self._pacer.follow(self._client)
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()
