"""The in-process twin of the Redis run leases (implements `kenning.pipeline.lease.Leases`): the same
leases, grace, failures and claims, on a monotonic clock behind a lock. Tests give it a clock of
their own, and expire a lease by advancing it."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from kenning.pipeline.lease import LeaseState

# As in Redis: a run's leases and failure go away this long after they were last written.
KEY_EXPIRY_MS = 24 * 3600 * 1000
FAILURE_CHARS = 2000


@dataclass
class _Expiring:
    """A value that is gone from `until_ms` on."""

    until_ms: int


@dataclass
class _Leases(_Expiring):
    units: dict[str, int] = field(default_factory=dict)


@dataclass
class _Text(_Expiring):
    text: str = ""


E = TypeVar("E", bound=_Expiring)


class MemoryLeases:
    """Run leases held by one process; each unit is recorded with the host and process holding it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._holder = f"{socket.gethostname()}:{os.getpid()}"
        self._leases: dict[str, _Leases] = {}
        self._failures: dict[str, _Text] = {}
        self._claims: dict[str, _Text] = {}
        self._lock = threading.Lock()

    def renew(self, run_id: str, unit: str, lease_s: float) -> None:
        with self._lock:
            self._hold(run_id, f"{unit}@{self._holder}", lease_s)

    def state(self, run_id: str) -> LeaseState:
        with self._lock:
            now = self._now()
            leases = _live(self._leases, run_id, now)
            failure = _live(self._failures, run_id, now)
            return LeaseState(
                now_ms=now,
                leases=dict(leases.units) if leases else {},
                failure=failure.text if failure else "",
            )

    def grant_grace(self, run_id: str, lease_s: float) -> bool:
        with self._lock:
            if _live(self._leases, run_id, self._now()) is not None:
                return False
            self._hold(run_id, "grace@supervisor", lease_s)
            return True

    def note_failure(self, run_id: str, error: str) -> None:
        with self._lock:
            self._failures[run_id] = _Text(self._now() + KEY_EXPIRY_MS, error[:FAILURE_CHARS])

    def claim(self, run_id: str, ttl_s: float) -> bool:
        with self._lock:
            now = self._now()
            if _live(self._claims, run_id, now) is not None:
                return False
            self._claims[run_id] = _Text(now + _ms(ttl_s), self._holder)
            return True

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._leases.pop(run_id, None)
            self._failures.pop(run_id, None)

    def _hold(self, run_id: str, member: str, lease_s: float) -> None:
        """The caller holds the lock."""
        now = self._now()
        leases = _live(self._leases, run_id, now) or _Leases(0)
        leases.units[member] = now + _ms(lease_s)
        leases.until_ms = now + KEY_EXPIRY_MS
        self._leases[run_id] = leases

    def _now(self) -> int:
        return int(self._clock() * 1000)


def _live(values: dict[str, E], run_id: str, now_ms: int) -> E | None:
    """The run's value unless it has expired (then it is dropped)."""
    value = values.get(run_id)
    if value is not None and value.until_ms <= now_ms:
        del values[run_id]
        return None
    return value


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
