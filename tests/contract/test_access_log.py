"""One contract for the AccessLog: the SQL log (SQLite, PostgreSQL) and its in-memory twin."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa

from kenning.pipeline.ports import AccessLog
from kenning.storage.metadata.access import BATCH, MemoryAccessLog, SqlAccessLog
from kenning.storage.metadata.sql import migrate
from kenning.storage.sql.engine import open_engine
from tests.threads import at_once

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
NOON = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
THREADS = 8


@pytest.fixture(scope="module")
def postgres_engine(postgres_url: str) -> Iterator[sa.Engine]:
    """One migrated engine on the session's database; tests keep apart by unique dataset ids."""
    engine = open_engine(postgres_url)
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AccessLog]:
    if request.param == "memory":
        yield MemoryAccessLog()
        return
    if request.param == "postgres":
        yield SqlAccessLog(request.getfixturevalue("postgres_engine"))
        return
    engine = open_engine(f"sqlite:///{tmp_path / 'access.db'}")
    migrate(engine)
    yield SqlAccessLog(engine)
    engine.dispose()


@pytest.fixture
def dataset() -> str:
    return f"ds-{uuid.uuid4().hex[:12]}"


def test_retrievals_add_up_and_the_last_access_is_the_latest(log: AccessLog, dataset: str) -> None:
    # Given two retrievals of one element, the later one recorded first
    log.record(dataset, {"e1": 2, "e2": 1}, NOON + timedelta(hours=1))
    log.record(dataset, {"e1": 3}, NOON)
    # Then its count is their sum, and its last access the later time
    assert log.accesses(dataset, ["e1", "e2"]) == {
        "e1": (NOON + timedelta(hours=1), 5),
        "e2": (NOON + timedelta(hours=1), 1),
    }


def test_times_are_kept_to_the_microsecond_in_any_zone(log: AccessLog, dataset: str) -> None:
    at = datetime(2026, 3, 1, 14, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    log.record(dataset, {"e1": 1}, at)
    (last, count) = log.accesses(dataset, ["e1"])["e1"]
    assert last == at and last.utcoffset() is not None and count == 1


def test_only_elements_asked_for_and_ever_retrieved_are_answered(log: AccessLog, dataset: str) -> None:
    log.record(dataset, {"e1": 1, "e2": 1}, NOON)
    assert log.accesses(dataset, ["e1", "never"]) == {"e1": (NOON, 1)}
    assert log.accesses(dataset, []) == {}


def test_datasets_are_kept_apart(log: AccessLog, dataset: str) -> None:
    # Given one element id retrieved in two datasets
    other = dataset + "-other"
    log.record(dataset, {"e1": 1}, NOON)
    log.record(other, {"e1": 4}, NOON + timedelta(minutes=5))
    # Then each dataset has its own record, and forgetting one leaves the other
    assert log.accesses(dataset, ["e1"]) == {"e1": (NOON, 1)}
    log.forget_access(dataset)
    assert log.accesses(dataset, ["e1"]) == {}
    assert log.accesses(other, ["e1"]) == {"e1": (NOON + timedelta(minutes=5), 4)}


def test_recording_no_retrieval_records_nothing(log: AccessLog, dataset: str) -> None:
    log.record(dataset, {}, NOON)
    assert log.accesses(dataset, ["e1"]) == {}


def test_forgetting_some_elements_keeps_the_rest(log: AccessLog, dataset: str) -> None:
    log.record(dataset, {"e1": 1, "e2": 2, "e3": 3}, NOON)
    log.forget_access(dataset, ["e1", "e3", "never"])
    assert log.accesses(dataset, ["e1", "e2", "e3"]) == {"e2": (NOON, 2)}
    log.forget_access(dataset, [])
    assert log.accesses(dataset, ["e2"]) == {"e2": (NOON, 2)}


def test_an_element_forgotten_and_retrieved_again_counts_from_zero(log: AccessLog, dataset: str) -> None:
    log.record(dataset, {"e1": 7}, NOON)
    log.forget_access(dataset, ["e1"])
    log.record(dataset, {"e1": 1}, NOON - timedelta(days=1))
    assert log.accesses(dataset, ["e1"]) == {"e1": (NOON - timedelta(days=1), 1)}


def test_more_elements_than_a_batch_are_recorded_read_and_forgotten(log: AccessLog, dataset: str) -> None:
    ids = [f"e{n:05}" for n in range(2 * BATCH + 7)]
    log.record(dataset, dict.fromkeys(ids, 1), NOON)
    log.record(dataset, dict.fromkeys(ids[::2], 1), NOON)
    found = log.accesses(dataset, ids)
    assert len(found) == len(ids)
    assert [found[key][1] for key in ids[:4]] == [2, 1, 2, 1]
    log.forget_access(dataset, ids[: BATCH + 1])
    assert sorted(log.accesses(dataset, ids)) == ids[BATCH + 1 :]


def test_retrievals_recorded_at_once_all_count(log: AccessLog, dataset: str) -> None:
    # Given many searches that retrieved the same elements, recording from threads at once
    work = [
        partial(log.record, dataset, {"shared": 1, f"own-{n}": 1}, NOON + timedelta(seconds=n))
        for n in range(THREADS)
    ]
    # Then every retrieval is counted, and the last access is the latest
    assert at_once(work) == []
    found = log.accesses(dataset, ["shared", *(f"own-{n}" for n in range(THREADS))])
    assert found["shared"] == (NOON + timedelta(seconds=THREADS - 1), THREADS)
    assert all(found[f"own-{n}"] == (NOON + timedelta(seconds=n), 1) for n in range(THREADS))


def test_odd_element_ids_are_data(log: AccessLog, dataset: str) -> None:
    odd = ["'; DELETE FROM element_access; --", "100%_", "a\\b", "é"]
    log.record(dataset, dict.fromkeys(odd, 1), NOON)
    assert sorted(log.accesses(dataset, odd)) == sorted(odd)
    log.forget_access(dataset, odd[:1])
    assert sorted(log.accesses(dataset, odd)) == sorted(odd[1:])
