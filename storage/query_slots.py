"""Query slots of an embedded home, shared by its processes through locked files.

    <folder>/line      held (flock) by the one process whose first waiter looks for a free slot
    <folder>/slot-<n>  held by the process running a search in slot n

A waiter takes `line` (the kernel queues the others behind it), takes the first free slot, and
lets `line` go. Threads of one process queue on a mutex first, and a process never tries a slot
that one of its own threads holds: a lock taken through one open file is held by all its threads.
A process that dies frees what it held. The first in line waits at most `wait_s` for a slot, then
runs its search without one (logged), so a search held up somewhere cannot stop the others. One
limit stands: a process stopped (SIGSTOP) while first in line keeps the others waiting until it
goes on or ends.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

SLOT_WAIT_S = 30.0
FIRST_PAUSE_S = 0.0002
LONGEST_PAUSE_S = 0.002
LINE_FILE = "line"


class FileQuerySlots:
    """`QuerySlots` for every process of a home: at most `slots` searches at once among them."""

    def __init__(self, folder: Path, slots: int, wait_s: float = SLOT_WAIT_S) -> None:
        if slots < 1:
            raise ValueError(f"query slots must be at least 1, got {slots}")
        self._folder = folder
        self._count = slots
        self._wait_s = wait_s
        self._start()

    def _start(self) -> None:
        """This process's state: new, or again in a forked child (whose copies of the parent's
        files hold the parent's locks, and whose mutexes may have been held by its threads)."""
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._line = threading.Lock()
        self._files: dict[str, int] = {}
        self._held: set[int] = set()
        self._local = threading.local()

    @contextmanager
    def slot(self) -> Iterator[None]:
        if os.getpid() != self._pid:
            self._forget_parent()
        depth = getattr(self._local, "depth", 0)
        if not depth:
            self._local.number = self._take()
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if not depth:
                self._give(self._local.number)

    @contextmanager
    def released(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if not depth:
            yield
            return
        self._give(self._local.number)
        self._local.depth = 0
        try:
            yield
        finally:
            self._local.number = self._take()
            self._local.depth = depth

    @property
    def holds_slot(self) -> bool:
        """Whether this thread holds a slot now."""
        return bool(getattr(self._local, "depth", 0)) and self._local.number is not None

    def close(self) -> None:
        with self._mutex:
            files, self._files = self._files, {}
            self._held.clear()
        for descriptor in files.values():
            os.close(descriptor)

    def _take(self) -> int | None:
        """The number of the slot taken, or None when none came free in time."""
        deadline = time.monotonic() + self._wait_s
        if not self._line.acquire(timeout=self._wait_s):
            self._none_free()
            return None
        try:
            with self._mutex:
                line = self._file(LINE_FILE)
            fcntl.flock(line, fcntl.LOCK_EX)
            try:
                return self._first_free(deadline)
            finally:
                fcntl.flock(line, fcntl.LOCK_UN)
        finally:
            self._line.release()

    def _first_free(self, deadline: float) -> int | None:
        pause = FIRST_PAUSE_S
        while (number := self._try_slots()) is None:
            if time.monotonic() >= deadline:
                self._none_free()
                return None
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE_S)
        return number

    def _none_free(self) -> None:
        log.warning("no query slot came free in %g s: this search runs without one", self._wait_s)

    def _try_slots(self) -> int | None:
        with self._mutex:
            for number in range(self._count):
                if number in self._held:
                    continue
                try:
                    fcntl.flock(self._file(f"slot-{number}"), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                self._held.add(number)
                return number
        return None

    def _give(self, number: int | None) -> None:
        if number is None:
            return
        with self._mutex:
            if number in self._held:
                fcntl.flock(self._files[f"slot-{number}"], fcntl.LOCK_UN)
                self._held.discard(number)

    def _file(self, name: str) -> int:
        """The open file of `name`, opened once a process. Call it holding `_mutex`."""
        descriptor = self._files.get(name)
        if descriptor is None:
            self._folder.mkdir(parents=True, exist_ok=True)
            descriptor = os.open(self._folder / name, os.O_RDWR | os.O_CREAT, 0o644)
            self._files[name] = descriptor
        return descriptor

    def _forget_parent(self) -> None:
        """In a forked child: close the copies of the parent's files without unlocking them (an
        unlock through a copy would free the parent's slot), then start afresh."""
        for descriptor in self._files.values():
            os.close(descriptor)
        self._start()
