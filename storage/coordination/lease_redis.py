"""The leases of distributed runs in Redis (implements `kenning.pipeline.lease.Leases`).

Why Redis, with the chunk statuses in the metadata store: a lease is a clock that must keep
ticking while the metadata store is away. The faults a lease must tell apart are a run whose
workers are gone (leases stop being renewed) and a store that is briefly unreachable (the
workers are alive and ride it out): were the leases in PostgreSQL, every run would look dead
after an outage of the lease's length. Redis is what the tasks already need to hold the
dataset lock and to receive their messages, so it adds no dependency; expiry is native; and
when Redis loses its data, the queued messages are lost with the leases, so a run with no
lease left is indeed a run nobody will finish (`grant_grace` gives its tasks still in flight
one lease to show up). Times come from the Redis server's clock, so the hosts' clocks may differ.

Keys (under `kenning.workers.runtime.keys.lease_prefix`): `<run>` a sorted set of units scored by expiry (ms),
`<run>:failure` the error that ended the run when the metadata store could not record it,
`<run>:claim` a supervisor's short claim on the run.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.lease import LeaseState

# Lease keys outlive any lease by far, and go away with no one to delete them.
KEY_EXPIRY_MS = 24 * 3600 * 1000
_NOW = "local t = redis.call('time') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
_RENEW = (
    _NOW
    + """
redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('pexpire', KEYS[1], ARGV[3])
return now
"""
)
_STATE = (
    _NOW
    + """
local failure = redis.call('get', KEYS[2]) or ''
return {now, redis.call('zrange', KEYS[1], 0, -1, 'WITHSCORES'), failure}
"""
)
_GRACE = (
    _NOW
    + """
if redis.call('exists', KEYS[1]) == 1 then return 0 end
redis.call('zadd', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('pexpire', KEYS[1], ARGV[3])
return 1
"""
)


class RedisLeases:
    """Run leases in Redis; each unit is recorded with the host and process holding it."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._holder = f"{socket.gethostname()}:{os.getpid()}"
        self._renew = client.register_script(_RENEW)
        self._state = client.register_script(_STATE)
        self._grace = client.register_script(_GRACE)

    def renew(self, run_id: str, unit: str, lease_s: float) -> None:
        with _translated():
            self._renew(
                keys=[self._key(run_id)], args=[f"{unit}@{self._holder}", _ms(lease_s), KEY_EXPIRY_MS]
            )

    def state(self, run_id: str) -> LeaseState:
        key = self._key(run_id)
        with _translated():
            now, entries, failure = self._state(keys=[key, key + ":failure"])
        pairs = zip(entries[::2], entries[1::2], strict=True)
        leases = {_text(unit): int(float(score)) for unit, score in pairs}
        return LeaseState(now_ms=int(now), leases=leases, failure=_text(failure))

    def grant_grace(self, run_id: str, lease_s: float) -> bool:
        with _translated():
            given = self._grace(
                keys=[self._key(run_id)], args=["grace@supervisor", _ms(lease_s), KEY_EXPIRY_MS]
            )
        return bool(given)

    def note_failure(self, run_id: str, error: str) -> None:
        with _translated():
            self._client.set(self._key(run_id) + ":failure", error[:2000], px=KEY_EXPIRY_MS)

    def claim(self, run_id: str, ttl_s: float) -> bool:
        with _translated():
            return bool(self._client.set(self._key(run_id) + ":claim", self._holder, nx=True, px=_ms(ttl_s)))

    def forget(self, run_id: str) -> None:
        key = self._key(run_id)
        with _translated():
            self._client.delete(key, key + ":failure")

    def _key(self, run_id: str) -> str:
        return self._prefix + run_id


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except redis.RedisError as exc:
        raise TransientStoreError(f"run leases: {exc}") from exc
