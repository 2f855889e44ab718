"""One contract for the dataset locks: the file lock (embedded), the Redis run lock (Celery) and
their in-memory twin.

Every lock is a `Lock` (acquire and release under a fencing token); the Redis run lock and the
twin are also a `RunLock`, held by a run's id across tasks, and expire unless kept. Each test
gets two handles on one lock state: two file locks on one folder, two Redis clients, or the
twin itself twice (its users are threads). The twin runs on a clock the test advances to expire a
hold; the Redis locks expire on the server's clock, which the test waits on by polling.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import redis

from kenning.pipeline.ports import Lock, RunLock
from kenning.storage.coordination.lock import FileLock, MemoryLock
from kenning.storage.coordination.run_lock import RedisRunLock
from tests.clock import FakeClock

NAME = "dataset:t1:library"
TTL_S = 30.0
SHORT_TTL_S = 0.4
QUICK_TAKES = 50
POLL_S = 0.05
MAX_ROUNDS = 10_000


class Time:
    """How time passes for a lock under test: on a clock the test advances (the twin), or on the
    real one, which the test waits for by polling (the file lock, Redis)."""

    def __init__(self, fake: FakeClock | None = None) -> None:
        self.fake = fake

    def now(self) -> float:
        return self.fake() if self.fake is not None else time.monotonic()

    def passes(self, seconds: float) -> None:
        """Move the fake clock on; the real one moves by itself, and the test polls."""
        if self.fake is not None:
            self.fake.advance(seconds)

    def pace(self) -> None:
        """Between two polls of a lock on the real clock: let a little of it go by."""
        if self.fake is None:
            time.sleep(POLL_S)


class Handles:
    """Two handles on one lock state, how a holder that dies without letting go is made, and its time."""

    def __init__(
        self, kind: str, first: Lock, second: Lock, die_holding: Callable[[str], None], clock: Time
    ) -> None:
        self.kind = kind
        self.first = first
        self.second = second
        self.die_holding = die_holding
        self.time = clock


class RunLocks(NamedTuple):
    first: RunLock
    second: RunLock
    time: Time


def _die_holding_file_lock(root: Path) -> Callable[[str], None]:
    def die_holding(name: str) -> None:
        program = (
            "import os, sys; from pathlib import Path; "
            "from kenning.storage.coordination.lock import FileLock; "
            "token = FileLock(Path(sys.argv[1])).acquire(sys.argv[2], 30); "
            "os._exit(0 if token is not None else 3)"
        )
        subprocess.run([sys.executable, "-c", program, str(root), name], check=True, timeout=60)

    return die_holding


def _abandon(lock: Lock) -> Callable[[str], None]:
    # A holder that never lets go nor keeps the lock, as a killed worker leaves an expiring lock.
    def die_holding(name: str) -> None:
        assert lock.acquire(name, SHORT_TTL_S) is not None

    return die_holding


@pytest.fixture
def redis_locks(
    request: pytest.FixtureRequest, key_prefix: str
) -> Iterator[tuple[RedisRunLock, RedisRunLock]]:
    url = request.getfixturevalue("redis_url")
    clients = [redis.Redis.from_url(url), redis.Redis.from_url(url)]
    yield RedisRunLock(clients[0], key_prefix), RedisRunLock(clients[1], key_prefix)
    keys = list(clients[0].scan_iter(match=key_prefix + "*", count=100))
    if keys:
        clients[0].delete(*keys)
    for client in clients:
        client.close()


@pytest.fixture(params=["file", "memory", pytest.param("redis", marks=pytest.mark.redis)])
def locks(request: pytest.FixtureRequest, tmp_path: Path) -> Handles:
    if request.param == "file":
        files = FileLock(tmp_path), FileLock(tmp_path)
        return Handles("file", *files, _die_holding_file_lock(tmp_path), Time())
    if request.param == "memory":
        clock = FakeClock()
        twin = MemoryLock(clock)
        return Handles("memory", twin, twin, _abandon(twin), Time(clock))
    first, second = request.getfixturevalue("redis_locks")
    return Handles("redis", first, second, _abandon(first), Time())


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def run_locks(request: pytest.FixtureRequest) -> RunLocks:
    if request.param == "memory":
        clock = FakeClock()
        twin = MemoryLock(clock)
        return RunLocks(twin, twin, Time(clock))
    first, second = request.getfixturevalue("redis_locks")
    return RunLocks(first, second, Time())


def wait_for(acquire: Callable[[], int | None], clock: Time, within_s: float = 10.0) -> int | None:
    """The first token `acquire` gets, polling until `within_s` went by on the real clock; None if none."""
    deadline = time.monotonic() + within_s
    while (token := acquire()) is None and time.monotonic() < deadline:
        clock.pace()
    return token


# The Lock contract: file lock, Redis run lock, twin


def test_one_holder_at_a_time(locks: Handles) -> None:
    # Given a lock one handle holds
    token = locks.first.acquire(NAME, TTL_S)
    assert token is not None
    # When the other handle, or the same one, tries to take it, it is refused
    assert locks.second.acquire(NAME, TTL_S) is None
    assert locks.first.acquire(NAME, TTL_S) is None
    # Then once released, the other takes it, under a larger fencing token
    locks.first.release(NAME, token)
    again = locks.second.acquire(NAME, TTL_S)
    assert again is not None and again > token


def test_fencing_tokens_grow_with_every_acquisition(locks: Handles) -> None:
    tokens = []
    for handle in (locks.first, locks.second, locks.first, locks.second):
        token = handle.acquire(NAME, TTL_S)
        assert token is not None
        tokens.append(token)
        handle.release(NAME, token)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_release_with_another_token_leaves_the_lock_held(locks: Handles) -> None:
    # Given a lock held under one token, and a stale token of an earlier holder
    stale = locks.first.acquire(NAME, TTL_S)
    assert stale is not None
    locks.first.release(NAME, stale)
    token = locks.first.acquire(NAME, TTL_S)
    assert token is not None
    # When the stale token is used to release it, from either handle
    locks.first.release(NAME, stale)
    locks.second.release(NAME, stale)
    # Then the lock is still held
    assert locks.second.acquire(NAME, TTL_S) is None


def test_releasing_twice_or_a_free_lock_changes_nothing(locks: Handles) -> None:
    locks.first.release(NAME, 12345)
    token = locks.first.acquire(NAME, TTL_S)
    assert token is not None
    locks.first.release(NAME, token)
    locks.first.release(NAME, token)
    later = locks.second.acquire(NAME, TTL_S)
    assert later is not None
    locks.first.release(NAME, token)  # the first holder's token again: the second holder keeps it
    assert locks.first.acquire(NAME, TTL_S) is None


def test_locks_of_different_datasets_are_independent(locks: Handles) -> None:
    assert locks.first.acquire(NAME, TTL_S) is not None
    assert locks.second.acquire("dataset:t1:other", TTL_S) is not None
    assert locks.second.acquire("dataset:t2:library", TTL_S) is not None


def test_a_holder_that_dies_does_not_hold_the_lock_forever(locks: Handles) -> None:
    # Given a holder that went away without letting go (a killed process, or one that stopped
    # extending its expiring lock)
    locks.die_holding(NAME)
    locks.time.passes(SHORT_TTL_S)
    # When another holder asks for the lock, then it gets it: at once from the operating system
    # for the file lock, after the ttl for the expiring locks
    assert wait_for(lambda: locks.second.acquire(NAME, TTL_S), locks.time) is not None


# Expiry, and the RunLock contract: Redis run lock, twin


def test_a_lock_nobody_keeps_expires_after_its_ttl(run_locks: RunLocks) -> None:
    first, second, clock = run_locks
    token = first.acquire(NAME, SHORT_TTL_S)
    assert token is not None
    assert second.acquire(NAME, TTL_S) is None
    if clock.fake is not None:  # just short of its ttl, it is still held
        clock.passes(SHORT_TTL_S * 0.9)
        assert second.acquire(NAME, TTL_S) is None
    clock.passes(SHORT_TTL_S)
    later = wait_for(lambda: second.acquire(NAME, TTL_S), clock)
    assert later is not None and later > token


def test_a_run_takes_the_lock_once_and_again_under_the_same_token(run_locks: RunLocks) -> None:
    first, second, _ = run_locks
    # Given a run that took the dataset's lock
    token = first.take(NAME, "run-a", TTL_S)
    assert token is not None
    # When its tasks, on any worker, take or keep it again, they share its token
    assert second.take(NAME, "run-a", TTL_S) == token
    assert second.keep(NAME, "run-a", TTL_S) == token
    assert first.holder(NAME) == token == second.holder(NAME)
    # Then another run, or a plain acquirer, is refused
    assert second.take(NAME, "run-b", TTL_S) is None
    assert second.keep(NAME, "run-b", TTL_S) is None
    assert second.acquire(NAME, TTL_S) is None


def test_only_the_holding_run_releases_it(run_locks: RunLocks) -> None:
    first, second, _ = run_locks
    token = first.take(NAME, "run-a", TTL_S)
    assert token is not None
    second.release_run(NAME, "run-b")
    assert second.take(NAME, "run-b", TTL_S) is None
    second.release_run(NAME, "run-a")
    assert first.holder(NAME) is None and first.keep(NAME, "run-a", TTL_S) is None
    later = second.take(NAME, "run-b", TTL_S)
    assert later is not None and later > token


def test_keeping_the_lock_extends_it(run_locks: RunLocks) -> None:
    first, second, clock = run_locks
    assert first.take(NAME, "run-a", SHORT_TTL_S) is not None
    # While the run keeps it, until its clock is well past its ttl, nobody else gets it
    deadline = clock.now() + 3 * SHORT_TTL_S
    for _ in range(MAX_ROUNDS):
        if clock.now() >= deadline:
            break
        assert first.keep(NAME, "run-a", SHORT_TTL_S) is not None
        assert second.take(NAME, "run-b", TTL_S) is None
        clock.passes(SHORT_TTL_S / 4)
        clock.pace()
    assert clock.now() >= deadline


def test_a_run_whose_lock_expired_takes_it_again_under_a_larger_token(
    run_locks: RunLocks,
) -> None:
    first, second, clock = run_locks
    # Given a run whose every task died, so that nobody kept its lock, until its lock expired
    token = first.take(NAME, "run-a", SHORT_TTL_S)
    assert token is not None
    clock.passes(SHORT_TTL_S)
    assert wait_for(lambda: 0 if first.holder(NAME) is None else None, clock) == 0
    # When a redelivered task of that run comes back
    assert second.keep(NAME, "run-a", TTL_S) is None
    assert second.holder(NAME) is None
    again = second.take(NAME, "run-a", TTL_S)
    # Then it holds the lock again for its run, under a larger fencing token
    assert again is not None and again > token
    assert first.take(NAME, "run-b", TTL_S) is None


def test_the_lock_and_run_views_agree(run_locks: RunLocks) -> None:
    first, second, _ = run_locks
    # A lock taken by acquire is refused to runs, and released by its token
    token = first.acquire(NAME, TTL_S)
    assert token is not None and first.holder(NAME) == token
    assert second.take(NAME, "run-a", TTL_S) is None
    second.release(NAME, token)
    # A lock taken by a run is refused to acquirers, and its token releases it too
    run_token = second.take(NAME, "run-a", TTL_S)
    assert run_token is not None and run_token > token
    assert first.acquire(NAME, TTL_S) is None
    first.release(NAME, run_token)
    assert first.holder(NAME) is None


def test_holders_are_told_apart_by_id(run_locks: RunLocks) -> None:
    first, second, _ = run_locks
    runs = [f"run-{uuid.uuid4().hex}" for _ in range(2)]
    assert first.take(NAME, runs[0], TTL_S) is not None
    assert second.take(NAME, runs[1], TTL_S) is None
    first.release_run(NAME, runs[0])
    assert second.take(NAME, runs[1], TTL_S) is not None


@pytest.mark.redis
def test_tokens_keep_growing_after_redis_loses_the_lock(
    redis_locks: tuple[RedisRunLock, RedisRunLock], key_prefix: str, redis_url: str
) -> None:
    first, second = redis_locks
    # Given a run that took the lock many times in quick succession (more takes than
    # milliseconds went by), whose stale task still holds the last token
    stale = 0
    for _ in range(QUICK_TAKES):
        stale = first.take(NAME, "run-a", TTL_S) or 0
        first.release_run(NAME, "run-a")
    # When Redis loses its data (restarted without its files): the lock and its counter are gone
    client = redis.Redis.from_url(redis_url)
    client.delete(*[key_prefix + NAME + suffix for suffix in ("", ":fence", ":run")])
    client.close()
    # Then a run that takes the free lock at once gets a token the stale task never held: the
    # fence tells them apart
    fresh = second.take(NAME, "run-b", TTL_S)
    assert fresh is not None and fresh > stale
