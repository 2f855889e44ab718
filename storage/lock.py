"""Dataset locks: a Redis lock for workers, a file lock for embedded mode, a twin for tests."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

import redis

from pipeline.errors import TransientStoreError

# Take the lock only if free or expired; the fencing token only ever grows.
_ACQUIRE = """
if redis.call('exists', KEYS[1]) == 1 then return nil end
local token = redis.call('incr', KEYS[2])
redis.call('set', KEYS[1], token, 'PX', ARGV[1])
return token
"""
_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class RedisLock:
    """A lock shared by every worker process, expiring unless its holder extends it."""

    def __init__(self, client: redis.Redis, prefix: str = "kenning:lock:") -> None:
        self._client = client
        self._prefix = prefix
        self._acquire = client.register_script(_ACQUIRE)
        self._extend = client.register_script(_EXTEND)
        self._release = client.register_script(_RELEASE)

    def acquire(self, name: str, ttl_s: float) -> int | None:
        keys = [self._prefix + name, self._prefix + name + ":fence"]
        token = self._call(self._acquire, keys, [int(ttl_s * 1000)])
        return int(str(token)) if token is not None else None

    def extend(self, name: str, token: int, ttl_s: float) -> bool:
        return bool(self._call(self._extend, [self._prefix + name], [token, int(ttl_s * 1000)]))

    def release(self, name: str, token: int) -> None:
        self._call(self._release, [self._prefix + name], [token])

    def holder(self, name: str) -> int | None:
        value = self._client.get(self._prefix + name)
        return int(value) if value is not None else None

    @staticmethod
    def _call(script: redis.commands.core.Script, keys: list[str], args: list[int]) -> object:
        try:
            return script(keys=keys, args=args)
        except redis.RedisError as exc:
            raise TransientStoreError(f"dataset lock: {exc}") from exc


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
