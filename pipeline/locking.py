"""Holding a dataset lock for the length of a block, waiting a bounded time to get it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from kenning.pipeline.errors import KenningError
from kenning.pipeline.models import Scope
from kenning.pipeline.ports import Lock


class LockBusy(KenningError):
    """Another run holds the dataset lock and did not let go within the wait."""


def lock_name(scope: Scope) -> str:
    """The dataset's lock name: readable, and one per (tenant, dataset) whatever the names hold (the
    tenant's length comes first, so `acme` + `hr:x` and `acme:hr` + `x` are two locks). A lock that
    becomes a file is named by its hash (`kenning.storage.coordination.lock.FileLock`)."""
    return f"dataset:{len(scope.tenant)}:{scope.tenant}:{scope.dataset}"


@contextmanager
def held(lock: Lock, name: str, ttl_s: float, wait_s: float = 3600.0, poll_s: float = 0.2) -> Iterator[int]:
    """Wait for the lock (at most `wait_s`), hold it for the block, release it after."""
    deadline = time.monotonic() + wait_s
    token = lock.acquire(name, ttl_s)
    while token is None:
        if time.monotonic() >= deadline:
            raise LockBusy(f"{name} is held by another run")
        time.sleep(poll_s)
        token = lock.acquire(name, ttl_s)
    try:
        yield token
    finally:
        lock.release(name, token)


# The check a step's writes pass, set by the task that runs the step (see `fenced`), and called by
# the fenced writer (`fencing.fenced_services`) before each of them.
_fence: ContextVar[Callable[[], None] | None] = ContextVar("kenning_fence", default=None)


@contextmanager
def fenced(check: Callable[[], None]) -> Iterator[None]:
    """Make `check` the fence of the steps run in this block (and this context): each of their
    store writes calls it first (`fencing.fenced_services`), and does not happen when it raises
    (`LockLost`)."""
    token = _fence.set(check)
    try:
        yield
    finally:
        _fence.reset(token)


def check_fence() -> None:
    """Called right before a write (by `fencing.Fenced`): raises when the caller no longer holds its
    dataset lock."""
    check = _fence.get()
    if check is not None:
        check()
