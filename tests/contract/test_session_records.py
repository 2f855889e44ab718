"""One contract for the session records: memory, SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from kenning.pipeline.session import ModelUsage, SessionKey, SessionRecords
from kenning.storage.metadata.session_records import SqlSessionRecords
from kenning.storage.metadata.sql import migrate
from kenning.storage.sessions.memory import MemorySessionRecords
from kenning.storage.sql.engine import open_engine

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
START = datetime(2026, 1, 2, 9, 0, tzinfo=UTC)


@dataclass
class Clock:
    """A clock the test moves by hand."""

    now: datetime = field(default=START)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(scope="module")
def postgres_engine(postgres_url: str) -> Iterator[sa.Engine]:
    """One migrated engine on the session's database; tests keep apart by unique tenants."""
    engine = open_engine(postgres_url)
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=BACKENDS)
def records(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[SessionRecords]:
    if request.param == "memory":
        yield MemorySessionRecords(clock=clock)
        return
    if request.param == "postgres":
        yield SqlSessionRecords(request.getfixturevalue("postgres_engine"), clock=clock)
        return
    engine = open_engine(f"sqlite:///{tmp_path / 'metadata.db'}")
    migrate(engine)
    yield SqlSessionRecords(engine, clock=clock)
    engine.dispose()


@pytest.fixture
def key() -> SessionKey:
    return SessionKey(tenant=f"tenant-{uuid.uuid4().hex[:12]}", user="ada", session_id="s1")


def test_the_first_touch_creates_a_running_record(records: SessionRecords, key: SessionKey) -> None:
    assert records.get(key) is None

    touched = records.touch(key)

    stored = records.get(key)
    assert stored == touched
    assert stored is not None
    assert (stored.key, stored.status, stored.ended_at) == (key, "running", None)
    assert stored.started_at == stored.last_activity_at == START
    assert (stored.tokens_in, stored.tokens_out, stored.estimated_cost, stored.errors) == (0, 0, 0.0, 0)
    assert (stored.last_error, stored.models) == ("", {})
    assert stored.started_at.tzinfo is not None


def test_touches_add_usage_per_session_and_per_model(
    records: SessionRecords, key: SessionKey, clock: Clock
) -> None:
    records.touch(key, tokens_in=100, tokens_out=20, cost=0.5, model="model-a")
    clock.now += timedelta(minutes=5)
    records.touch(key, tokens_in=10, tokens_out=2, cost=0.25, model="model-b")
    records.touch(key, tokens_in=1, tokens_out=1, cost=0.125, model="model-a")
    records.touch(key)

    stored = records.get(key)
    assert stored is not None
    assert (stored.tokens_in, stored.tokens_out, stored.estimated_cost) == (111, 23, 0.875)
    assert stored.models == {
        "model-a": ModelUsage(tokens_in=101, tokens_out=21, cost=0.625, calls=2),
        "model-b": ModelUsage(tokens_in=10, tokens_out=2, cost=0.25, calls=1),
    }
    assert (stored.started_at, stored.last_activity_at) == (START, START + timedelta(minutes=5))


def test_errors_are_counted_and_the_last_one_kept(records: SessionRecords, key: SessionKey) -> None:
    records.touch(key, error="timeout")
    records.touch(key)
    records.touch(key, error="rate limited")

    stored = records.get(key)
    assert stored is not None
    assert (stored.errors, stored.last_error) == (2, "rate limited")


def test_end_marks_the_record_and_a_later_touch_reopens_it(
    records: SessionRecords, key: SessionKey, clock: Clock
) -> None:
    other = key.model_copy(update={"session_id": "never"})
    records.touch(key, tokens_in=5)
    clock.now += timedelta(minutes=1)

    assert records.end(key) is True
    assert records.end(other) is False
    assert records.get(other) is None
    clock.now += timedelta(minutes=1)
    assert records.end(key) is True

    ended = records.get(key)
    assert ended is not None
    assert (ended.status, ended.ended_at, ended.tokens_in) == ("ended", START + timedelta(minutes=1), 5)

    records.touch(key, tokens_in=1)
    reopened = records.get(key)
    assert reopened is not None
    assert (reopened.status, reopened.ended_at, reopened.tokens_in) == ("running", None, 6)


def test_the_state_is_computed_from_the_time_since_last_use(
    records: SessionRecords, key: SessionKey, clock: Clock
) -> None:
    # Given a running session last active at START, and an ended one
    ended = key.model_copy(update={"session_id": "done"})
    records.touch(key)
    records.touch(ended)
    records.end(ended)
    running, done = records.get(key), records.get(ended)
    assert running is not None and done is not None

    # Then it is running for 5 minutes after its last use, idle up to 30, abandoned after that;
    # ended stays ended
    assert running.state(START + timedelta(minutes=5)) == "running"
    assert running.state(START + timedelta(minutes=6)) == "idle"
    assert running.state(START + timedelta(minutes=30)) == "idle"
    assert running.state(START + timedelta(minutes=31)) == "abandoned"
    assert running.state(START + timedelta(minutes=11), idle_after=timedelta(minutes=10)) == "abandoned"
    assert done.state(START + timedelta(days=3)) == "ended"
    assert running.state() == "abandoned"  # the current time is long after START

    # And nothing is written: the stored status is still running
    assert running.status == "running"
    clock.now += timedelta(hours=2)
    records.touch(key)
    again = records.get(key)
    assert again is not None and again.state(clock.now + timedelta(minutes=1)) == "running"


def test_list_gives_the_tenants_records_most_recent_first(
    records: SessionRecords, key: SessionKey, clock: Clock
) -> None:
    pairs = [("ada", "a"), ("grace", "g"), ("ada", "b")]
    keys = [key.model_copy(update={"user": user, "session_id": sid}) for user, sid in pairs]
    for n, session in enumerate(keys):
        clock.now = START + timedelta(minutes=n)
        records.touch(session)
    records.touch(key.model_copy(update={"tenant": key.tenant + "-other"}))

    assert [record.key for record in records.list(key.tenant)] == [keys[2], keys[1], keys[0]]
    assert [record.key for record in records.list(key.tenant, user="ada")] == [keys[2], keys[0]]
    assert records.list(key.tenant, user="nobody") == []
    assert records.list(key.tenant + "-nobody") == []


def test_concurrent_touches_all_count(records: SessionRecords, key: SessionKey) -> None:
    def touch_ten(_: int) -> None:
        for _n in range(10):
            records.touch(key, tokens_in=1, tokens_out=2, cost=0.5, model="m")

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(touch_ten, range(6)))

    stored = records.get(key)
    assert stored is not None
    assert (stored.tokens_in, stored.tokens_out, stored.estimated_cost) == (60, 120, 30.0)
    assert stored.models["m"].calls == 60
