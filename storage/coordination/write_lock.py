"""One writer at a time across processes: a Redis lock (redis-py's) around a block."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.redact import redact_url

log = logging.getLogger(__name__)

# A write waits this long for another's; a writer that died frees the lock after its ttl.
WRITE_WAIT_S = 120.0
WRITE_LOCK_TTL_S = 300.0


@contextmanager
def one_writer(client: redis.Redis, name: str) -> Iterator[None]:
    """Hold the Redis lock `name` while the block runs: taken within `WRITE_WAIT_S`, or the block
    fails as a store that is away (and its task's work is tried again); a Redis that is away too."""
    lock = client.lock(name, timeout=WRITE_LOCK_TTL_S, blocking_timeout=WRITE_WAIT_S)
    try:
        taken = lock.acquire()
    except redis.RedisError as error:
        raise TransientStoreError(redact_url(f"the write lock {name} could not be taken: {error}")) from error
    if not taken:
        raise TransientStoreError(f"the write lock {name} was held longer than {WRITE_WAIT_S:.0f} s")
    try:
        yield
    finally:
        try:
            lock.release()
        except redis.RedisError as error:
            # Expired or Redis away: it frees itself after its ttl.
            log.warning("write lock %s not released: %s", name, error)
