"""One writer at a time across processes: a Redis lock (redis-py's) around a block.

The lock has a short ttl, extended while the block runs: a writer that dies (killed with its
worker) holds the others off for `WRITE_LOCK_TTL_S` at most, never for its whole write's bound.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.lock import Lock

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.redact import redact_url

log = logging.getLogger(__name__)

# A write waits this long for another's before its task's work is tried again.
WRITE_WAIT_S = 120.0
# The lock's ttl, extended every third of it while its holder writes.
WRITE_LOCK_TTL_S = 10.0
# How often a writer waiting on another process's write asks again (redis-py polls).
WRITE_POLL_S = 0.01

# The writers of this process wait on each other here, not by asking Redis over and over.
_local: dict[str, threading.Lock] = {}
_local_mutex = threading.Lock()


def _local_lock(name: str) -> threading.Lock:
    with _local_mutex:
        return _local.setdefault(name, threading.Lock())


@contextmanager
def one_writer(client: redis.Redis, name: str) -> Iterator[None]:
    """Hold the Redis lock `name` while the block runs: taken within `WRITE_WAIT_S`, or the block
    fails as a store that is away (and its task's work is tried again); a Redis that is away too.
    The writers of one process take turns on a lock of their own first, so only one of them at a
    time waits on the Redis lock."""
    started = time.monotonic()
    local = _local_lock(name)
    if not local.acquire(timeout=WRITE_WAIT_S):
        raise TransientStoreError(f"the write lock {name} was held longer than {WRITE_WAIT_S:.0f} s")
    try:
        left = max(0.0, WRITE_WAIT_S - (time.monotonic() - started))
        with _redis_writer(client, name, left):
            yield
    finally:
        local.release()


@contextmanager
def _redis_writer(client: redis.Redis, name: str, wait_s: float) -> Iterator[None]:
    lock = client.lock(
        name, timeout=WRITE_LOCK_TTL_S, sleep=WRITE_POLL_S, blocking_timeout=wait_s, thread_local=False
    )
    try:
        taken = lock.acquire()
    except redis.RedisError as error:
        raise TransientStoreError(redact_url(f"the write lock {name} could not be taken: {error}")) from error
    if not taken:
        raise TransientStoreError(f"the write lock {name} was held longer than {WRITE_WAIT_S:.0f} s")
    done = threading.Event()
    keeper = threading.Thread(target=_keep, args=(lock, done), name="write-lock", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        done.set()
        keeper.join(timeout=WRITE_LOCK_TTL_S)
        try:
            lock.release()
        except redis.RedisError as error:
            # Expired or Redis away: it frees itself after its ttl.
            log.warning("write lock %s not released: %s", name, error)


def _keep(lock: Lock, done: threading.Event) -> None:
    """Extend the lock's ttl every third of it until `done`; a failed extension is left to the
    next one (the ttl outlasts two of them)."""
    while not done.wait(WRITE_LOCK_TTL_S / 3):
        try:
            lock.extend(WRITE_LOCK_TTL_S, replace_ttl=True)
        except redis.RedisError as error:
            log.warning("write lock %s not extended: %s", lock.name, error)
