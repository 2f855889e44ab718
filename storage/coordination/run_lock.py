"""The dataset run lock and delivery counts in Redis, for Celery workers."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from kenning.pipeline.errors import TransientStoreError

# Keys of a dataset lock: <name> holds the fencing token of the latest take and expires unless
# extended; <name>:fence the last token given (tokens only grow); <name>:run the id of the run
# that took it, expiring with it. Each script checks and updates in one atomic step.
# A counter that starts (first take, or Redis lost its data) starts at the server's clock in
# microseconds, so tokens keep growing across a data loss while fewer takes were made than
# microseconds went by (each take is a round trip to Redis) and the server's clock does not step
# back: a stale task's token is never given out again. (In milliseconds, a fast client taking the
# lock a few times within one millisecond got a stale token back after a data loss.) Tokens stay
# below 2^53, exact in Lua's numbers, and a counter started in milliseconds only grows by it.
_TAKE = """
local holder = redis.call('get', KEYS[1])
if holder then
  if redis.call('get', KEYS[3]) ~= ARGV[1] then return nil end
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('pexpire', KEYS[3], ARGV[2])
  return tonumber(holder)
end
local token = redis.call('incr', KEYS[2])
if token == 1 then
  local now = redis.call('time')
  token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('set', KEYS[2], token)
end
redis.call('set', KEYS[1], token, 'PX', ARGV[2])
redis.call('set', KEYS[3], ARGV[1], 'PX', ARGV[2])
return token
"""
_KEEP = """
local holder = redis.call('get', KEYS[1])
if holder and redis.call('get', KEYS[3]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('pexpire', KEYS[3], ARGV[2])
  return tonumber(holder)
end
return nil
"""
_RELEASE = """
if redis.call('get', KEYS[3]) == ARGV[1] then return redis.call('del', KEYS[1], KEYS[3]) end
return 0
"""
_RELEASE_TOKEN = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1], KEYS[3]) end
return 0
"""


class RedisRunLock:
    """The dataset lock in Redis, held by a pipeline run: by all of its tasks, under a fencing token.

    Implements `kenning.pipeline.ports.RunLock`. The rule the tasks follow, and how their writes are
    fenced by the token (`holder`), is in `kenning.workers.celery.tasks.holding`.
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._take = client.register_script(_TAKE)
        self._keep = client.register_script(_KEEP)
        self._release = client.register_script(_RELEASE)
        self._release_token = client.register_script(_RELEASE_TOKEN)

    def acquire(self, name: str, ttl_s: float) -> int | None:
        """Take the lock if it is free, for a holder of its own (expiring after `ttl_s`)."""
        return self.take(name, f"lock-{uuid.uuid4().hex}", ttl_s)

    def release(self, name: str, token: int) -> None:
        """Let go, only if the lock is still held under this token."""
        with _translated("dataset lock"):
            self._release_token(keys=self._keys(name), args=[str(token)])

    def take(self, name: str, run_id: str, ttl_s: float) -> int | None:
        """For the run: a new, larger token when the lock is free; the current one, extended, when the
        run holds it already; None when another run holds it."""
        return self._token(self._take, name, [run_id, int(ttl_s * 1000)])

    def keep(self, name: str, run_id: str, ttl_s: float) -> int | None:
        """Extend the lock if the run holds it; its token, or None when it is free or held by another run."""
        return self._token(self._keep, name, [run_id, int(ttl_s * 1000)])

    def release_run(self, name: str, run_id: str) -> None:
        """Let go, only if the run holds the lock."""
        with _translated("dataset lock"):
            self._release(keys=self._keys(name), args=[run_id])

    def holder(self, name: str) -> int | None:
        """The token the lock is held under, or None when it is free."""
        with _translated("dataset lock"):
            value = self._client.get(self._prefix + name)
        return int(value) if value is not None else None

    def _token(self, script: Any, name: str, args: list[str | int]) -> int | None:
        with _translated("dataset lock"):
            token = script(keys=self._keys(name), args=args)
        return int(token) if token is not None else None

    def _keys(self, name: str) -> list[str]:
        key = self._prefix + name
        return [key, key + ":fence", key + ":run"]


class Deliveries:
    """How many times each attempt of a task has been redelivered: one expiring Redis counter each."""

    def __init__(self, client: redis.Redis, prefix: str, expiry_s: float) -> None:
        self._client = client
        self._prefix = prefix
        self._expiry_s = int(expiry_s)

    def count(self, task_id: str, attempt: int) -> int:
        """Count one more delivery of the task's attempt (its retry number); the count so far."""
        key = f"{self._prefix}{task_id}:{attempt}"
        with _translated("delivery count"):
            pipeline = self._client.pipeline()
            pipeline.incr(key)
            pipeline.expire(key, self._expiry_s)
            delivered, _ = pipeline.execute()
        return int(delivered)


@contextmanager
def _translated(what: str) -> Iterator[None]:
    # The lock and the counts sit in Redis next to the broker: a lost connection is worth a retry.
    try:
        yield
    except redis.RedisError as exc:
        raise TransientStoreError(f"{what}: {exc}") from exc
