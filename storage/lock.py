"""Dataset locks for embedded mode: a file lock across processes, and its in-memory twin."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path


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

    def release(self, name: str, token: int) -> None:
        with self._mutex:
            descriptor, held = self._held.get(name, (0, -1))
            if held != token:
                return
            del self._held[name]
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        os.close(descriptor)


class MemoryLock:
    """An in-process twin of the file lock, with expiry on a monotonic clock."""

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

    def release(self, name: str, token: int) -> None:
        with self._mutex:
            if self._held.get(name, (None, 0.0))[0] == token:
                del self._held[name]
