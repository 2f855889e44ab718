"""Dataset locks: the run lock in Redis for workers, a file lock for embedded mode, an in-memory twin."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from pipeline.errors import TransientStoreError

# Keys of a dataset lock: <name> holds the fencing token of the latest take and expires unless
# extended; <name>:fence the last token given (tokens only grow); <name>:run the id of the run
# that took it, expiring with it. Each script checks and updates in one atomic step.
_TAKE = """
local holder = redis.call('get', KEYS[1])
if holder then
  if redis.call('get', KEYS[3]) ~= ARGV[1] then return nil end
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('pexpire', KEYS[3], ARGV[2])
  return tonumber(holder)
end
local token = redis.call('incr', KEYS[2])
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


class RunLock:
    """The dataset lock in Redis, held by a pipeline run: by all of its tasks, under a fencing token.

    The rule the tasks follow is in `workers.tasks.holding`.
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._take = client.register_script(_TAKE)
        self._keep = client.register_script(_KEEP)
        self._release = client.register_script(_RELEASE)

    def take(self, name: str, run_id: str, ttl_s: float) -> int | None:
        """For the run: a new, larger token when the lock is free; the current one, extended, when the
        run holds it already; None when another run holds it."""
        return self._token(self._take, name, [run_id, int(ttl_s * 1000)])

    def keep(self, name: str, run_id: str, ttl_s: float) -> int | None:
        """Extend the lock if the run holds it; its token, or None when it is free or held by another run."""
        return self._token(self._keep, name, [run_id, int(ttl_s * 1000)])

    def release(self, name: str, run_id: str) -> None:
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



class FileLock:
    """An advisory file lock per dataset for embedded mode: one holder across processes.

    The lock lasts until released or until its process dies; the ttl is unused
    because the operating system frees the lock of a dead process.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._held: dict[str, tuple[int, int]] = {}
        self._mutex = threading.Lock()

    def acquire(self, name: str, ttl_s: float) -> int | None:
        self._root.mkdir(parents=True, exist_ok=True)
        path = self._root / (name.replace("/", "__") + ".lock")
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        token = time.time_ns()
        with self._mutex:
            self._held[name] = (descriptor, token)
        return token

    def extend(self, name: str, token: int, ttl_s: float) -> bool:
        with self._mutex:
            return self._held.get(name, (0, -1))[1] == token

    def release(self, name: str, token: int) -> None:
        with self._mutex:
            descriptor, held = self._held.get(name, (0, -1))
            if held != token:
                return
            del self._held[name]
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


class MemoryLock:
    """An in-process twin of the Redis lock, with expiry on a monotonic clock."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, float]] = {}
        self._fence = 0
        self._mutex = threading.Lock()

    def acquire(self, name: str, ttl_s: float) -> int | None:
        with self._mutex:
            current = self._held.get(name)
            if current and current[1] > time.monotonic():
                return None
            self._fence += 1
            self._held[name] = (self._fence, time.monotonic() + ttl_s)
            return self._fence

    def extend(self, name: str, token: int, ttl_s: float) -> bool:
        with self._mutex:
            current = self._held.get(name)
            if not current or current[0] != token or current[1] <= time.monotonic():
                return False
            self._held[name] = (token, time.monotonic() + ttl_s)
            return True

    def release(self, name: str, token: int) -> None:
        with self._mutex:
            if self._held.get(name, (None, 0.0))[0] == token:
                del self._held[name]
