"""Dataset locks for embedded mode: a file lock across processes, and the in-memory twin of every
lock (the file lock's acquire and release, and the Redis run lock's take, keep and release by run)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class FileLock:
    """An advisory file lock per dataset for embedded mode: one holder across processes.

    The lock lasts until released or until its process dies; the ttl is unused
    because the operating system frees the lock of a dead process. The fencing token
    is a counter kept in the lock file, so that it grows across processes too.
    """

    def __init__(self, root: Path) -> None:
        self._root = root
        self._held: dict[str, tuple[int, int]] = {}
        self._mutex = threading.Lock()

    def acquire(self, name: str, ttl_s: float) -> int | None:
        self._root.mkdir(parents=True, exist_ok=True)
        path = self._root / lock_file_name(name)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        token = _next_token(descriptor)
        with self._mutex:
            self._held[name] = (descriptor, token)
        return token

    def release(self, name: str, token: int) -> None:
        with self._mutex:
            descriptor, held = self._held.get(name, (0, -1))
            if held != token:
                return
            del self._held[name]
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


def lock_file_name(name: str) -> str:
    """The file of a lock: the hash of its name, so that it fits any filesystem whatever the
    dataset's name holds (its length, `/`, bytes a filesystem refuses), and no two names share it."""
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest() + ".lock"


def _next_token(descriptor: int) -> int:
    """One more than the token the lock file holds, written back; the caller holds the lock."""
    os.lseek(descriptor, 0, os.SEEK_SET)
    text = os.read(descriptor, 64).decode("ascii", "replace").strip()
    token = int(text) + 1 if text.isdigit() else 1
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, str(token).encode("ascii"), 0)
    return token


@dataclass
class _Hold:
    token: int
    holder: str
    expires: float


class MemoryLock:
    """The in-process twin of the file lock and of the Redis run lock, with expiry on a monotonic
    clock (or on `clock`: a test's own, that it advances to expire a hold)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[str, _Hold] = {}
        self._fence = 0
        self._mutex = threading.Lock()

    def acquire(self, name: str, ttl_s: float) -> int | None:
        return self.take(name, f"lock-{uuid.uuid4().hex}", ttl_s)

    def release(self, name: str, token: int) -> None:
        with self._mutex:
            current = self._current(name)
            if current is not None and current.token == token:
                del self._held[name]

    def take(self, name: str, run_id: str, ttl_s: float) -> int | None:
        with self._mutex:
            current = self._current(name)
            if current is None:
                self._fence += 1
                current = self._held[name] = _Hold(self._fence, run_id, 0.0)
            elif current.holder != run_id:
                return None
            current.expires = self._clock() + ttl_s
            return current.token

    def keep(self, name: str, run_id: str, ttl_s: float) -> int | None:
        with self._mutex:
            current = self._current(name)
            if current is None or current.holder != run_id:
                return None
            current.expires = self._clock() + ttl_s
            return current.token

    def release_run(self, name: str, run_id: str) -> None:
        with self._mutex:
            current = self._current(name)
            if current is not None and current.holder == run_id:
                del self._held[name]

    def holder(self, name: str) -> int | None:
        with self._mutex:
            current = self._current(name)
            return current.token if current is not None else None

    def _current(self, name: str) -> _Hold | None:
        """The live hold of the lock; an expired one is dropped. The caller holds the mutex."""
        current = self._held.get(name)
        if current is not None and current.expires <= self._clock():
            del self._held[name]
            return None
        return current
