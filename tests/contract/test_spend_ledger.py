"""The SQL spend ledger under many threads: every write committed before its call returns, fewer
transactions than writes. Then one contract for every SpendLedger: the SQL ledger (SQLite,
PostgreSQL) and its in-memory twin."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.pipeline.models import utcnow
from kenning.pipeline.session import SessionKey
from kenning.pipeline.spend import Charge, Spend, SpendLedger
from kenning.storage.metadata.spend import BATCH, MemorySpendLedger, SqlSpendLedger
from kenning.storage.metadata.sql import migrate
from kenning.storage.sql.engine import open_engine
from tests.threads import at_once

THREADS = 16


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    yield from _migrated(request, tmp_path, request.param)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SpendLedger]:
    if request.param == "memory":
        yield MemorySpendLedger()
        return
    for engine in _migrated(request, tmp_path, request.param):
        yield SqlSpendLedger(engine)


def _migrated(request: pytest.FixtureRequest, tmp_path: Path, database: str) -> Iterator[sa.Engine]:
    url = (
        request.getfixturevalue("postgres_url")
        if database == "postgres"
        else f"sqlite:///{tmp_path / 'm.db'}"
    )
    made = open_engine(url)
    migrate(made)
    yield made
    made.dispose()


def commits_of(engine: sa.Engine) -> list[int]:
    """Counts the engine's commits from now on."""
    commits: list[int] = []
    sa.event.listen(engine, "commit", lambda _conn: commits.append(1))
    return commits


def first_waits_for(ledger: SqlSpendLedger, writes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Holds the ledger's next transaction until the rest of `writes` wait behind it (bounded)."""
    group = ledger._writes
    transaction = group._transaction
    first = [True]

    def held(batch: list[Any]) -> None:
        if first[0]:
            first[0] = False
            deadline = time.monotonic() + 30
            while len(group._queued) < writes - len(batch) and time.monotonic() < deadline:
                time.sleep(0.001)
        transaction(batch)

    monkeypatch.setattr(group, "_transaction", held)


def test_calls_sent_at_once_are_all_recorded_in_fewer_transactions(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a ledger whose first transaction waits until the other writes queue behind it, and one
    # run's calls sent from many threads at once
    ledger = SqlSpendLedger(engine)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    charge = Charge(run_id=run_id, dataset_id="d1")
    ids = [f"{run_id}-{n}" for n in range(THREADS)]
    commits = commits_of(engine)
    first_waits_for(ledger, THREADS, monkeypatch)
    # When each thread records its call sent, then answered
    errors = at_once([partial(_call, ledger, attempt, charge) for attempt in ids])
    # Then every call and its tokens are recorded, in fewer transactions than writes
    assert errors == []
    assert ledger.totals([run_id])[run_id] == Spend(
        calls=THREADS, prompt_tokens=10 * THREADS, completion_tokens=THREADS
    )
    assert len(commits) < 2 * THREADS


def _call(ledger: SpendLedger, attempt: str, charge: Charge) -> None:
    ledger.sent(attempt, charge, "sim", prompt_tokens=5)
    ledger.answered(attempt, prompt_tokens=10, completion_tokens=1)


def test_every_write_of_a_failed_transaction_raises_its_own_transient_error(tmp_path: Path) -> None:
    # Given a ledger on a database another connection holds locked, and that does not wait for it
    path = tmp_path / "locked.db"
    setup = open_engine(f"sqlite:///{path}")
    migrate(setup)
    setup.dispose()
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    ledger = SqlSpendLedger(engine)
    charge = Charge(run_id="r", dataset_id="d")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    # When calls are recorded from many threads at once
    try:
        errors = at_once([partial(ledger.sent, f"a{n}", charge, "sim") for n in range(THREADS)])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # Then each of them raised an error of its own, still one a retry may wait out
    assert len(errors) == THREADS and all(type(error) is TransientStoreError for error in errors)
    assert len({id(error) for error in errors}) == THREADS
    engine.dispose()


def test_a_write_that_fails_fails_alone(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given calls recorded at once from many threads, one of them under an attempt id already taken
    ledger = SqlSpendLedger(engine)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    charge = Charge(run_id=run_id, dataset_id="d1")
    ledger.sent(f"{run_id}-taken", charge, "sim")
    first_waits_for(ledger, THREADS, monkeypatch)
    calls = [partial(_call, ledger, f"{run_id}-{n}", charge) for n in range(THREADS - 1)]
    taken = partial(ledger.sent, f"{run_id}-taken", charge, "sim")
    # When they are recorded
    errors = at_once([taken, *calls])  # the last thread in leads: the taken id waits with the rest
    # Then only the one under the taken id failed, and every other call is recorded
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    assert ledger.totals([run_id])[run_id].calls == THREADS


def test_a_write_whose_transaction_was_interrupted_never_passes_for_committed(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a ledger whose first transaction waits until the other writes queue behind it, and a
    # database call that is interrupted (an exception that is not an error) when it writes one attempt
    ledger = SqlSpendLedger(engine)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    charge = Charge(run_id=run_id, dataset_id="d1")
    doomed = f"{run_id}-doomed"

    def interrupt(_conn: Any, _cursor: Any, _statement: str, parameters: Any, *_rest: Any) -> None:
        if doomed in str(parameters):
            raise KeyboardInterrupt

    sa.event.listen(engine, "before_cursor_execute", interrupt)
    first_waits_for(ledger, 3, monkeypatch)
    # When it is recorded at once with another call, behind a third that commits first
    sent = [
        partial(ledger.sent, attempt, charge, "sim")
        for attempt in (doomed, f"{run_id}-other", f"{run_id}-first")
    ]
    errors = at_once(sent)
    sa.event.remove(engine, "before_cursor_execute", interrupt)
    # Then both calls of the interrupted transaction raised: none returned as if its row were there
    assert sorted(type(error).__name__ for error in errors) == ["KeyboardInterrupt", "StoreError"]
    assert ledger.totals([run_id])[run_id].calls == 1


# The SpendLedger contract: the SQL ledger (SQLite, PostgreSQL) and its in-memory twin


def new_run() -> Charge:
    """A run of its own (attempt ids start with its id: the PostgreSQL database is the session's)."""
    return Charge(run_id=f"run-{uuid.uuid4().hex[:12]}", dataset_id="d1")


def test_an_answer_replaces_the_tokens_expected_with_those_billed(ledger: SpendLedger) -> None:
    charge = new_run()
    # Given one request sent, expected to cost 100 and 20 tokens, and another not answered yet
    ledger.sent(f"{charge.run_id}-a1", charge, "m", prompt_tokens=100, completion_tokens=20)
    ledger.sent(f"{charge.run_id}-a2", charge, "m", prompt_tokens=50, completion_tokens=5)
    assert ledger.totals([charge.run_id]) == {charge.run_id: Spend(2, 150, 25)}
    # When the first is answered, billed 90 and 30
    ledger.answered(f"{charge.run_id}-a1", prompt_tokens=90, completion_tokens=30)
    # Then the run's spend holds what was billed for it, and what the other is expected to cost
    assert ledger.totals([charge.run_id]) == {charge.run_id: Spend(2, 140, 35)}


def test_a_request_answered_with_nothing_billed_is_one_failed(ledger: SpendLedger) -> None:
    # Given a request that failed (nothing billed), and its retry, answered
    charge = new_run()
    ledger.sent(f"{charge.run_id}-try-1", charge, "m", prompt_tokens=100)
    ledger.answered(f"{charge.run_id}-try-1", 0, 0)
    ledger.sent(f"{charge.run_id}-try-2", charge, "m", prompt_tokens=100)
    ledger.answered(f"{charge.run_id}-try-2", 100, 10)
    # Then the run sent two requests, one of them failed
    spend = ledger.totals([charge.run_id])[charge.run_id]
    assert spend == Spend(calls=2, prompt_tokens=100, completion_tokens=10, failed=1)
    assert spend.answered == 1


def test_each_run_is_summed_apart_and_runs_without_attempts_are_left_out(ledger: SpendLedger) -> None:
    first, second = new_run(), new_run()
    ledger.sent(f"{first.run_id}-1", first, "m", prompt_tokens=10, completion_tokens=1)
    ledger.sent(f"{first.run_id}-2", first, "m", prompt_tokens=10, completion_tokens=1)
    ledger.sent(f"{second.run_id}-1", second, "m", prompt_tokens=7, completion_tokens=2)
    runs = [first.run_id, second.run_id, first.run_id, "never-ran"]
    assert ledger.totals(runs) == {first.run_id: Spend(2, 20, 2), second.run_id: Spend(1, 7, 2)}
    assert ledger.totals([second.run_id]) == {second.run_id: Spend(1, 7, 2)}
    assert ledger.totals([]) == {}


def test_the_runs_of_more_than_a_batch_are_summed(ledger: SpendLedger) -> None:
    charges = [new_run() for _ in range(2 * BATCH + 3)]
    for n, charge in enumerate(charges):
        ledger.sent(f"{charge.run_id}-a", charge, "m", prompt_tokens=n + 1)
    found = ledger.totals([charge.run_id for charge in charges])
    assert found == {charge.run_id: Spend(1, n + 1, 0) for n, charge in enumerate(charges)}


def test_an_answer_for_an_attempt_never_sent_records_nothing(ledger: SpendLedger) -> None:
    charge = new_run()
    ledger.answered(f"{charge.run_id}-ghost", 100, 10)
    assert ledger.totals([charge.run_id]) == {}


def test_an_attempt_id_is_recorded_once(ledger: SpendLedger) -> None:
    # Given a request recorded as sent
    charge = new_run()
    ledger.sent(f"{charge.run_id}-a1", charge, "m", prompt_tokens=100)
    # When another is recorded under its id, it is refused, as a lasting error
    with pytest.raises(StoreError) as refused:
        ledger.sent(f"{charge.run_id}-a1", new_run(), "m", prompt_tokens=5)
    assert type(refused.value) is StoreError
    # And the first is recorded as it was
    assert ledger.totals([charge.run_id]) == {charge.run_id: Spend(1, 100, 0)}


def test_calls_recorded_at_once_all_count(ledger: SpendLedger) -> None:
    charge = new_run()
    errors = at_once(
        [partial(_call, ledger, f"{charge.run_id}-{n}", charge) for n in range(THREADS)], timeout_s=60
    )
    assert errors == []
    assert ledger.totals([charge.run_id]) == {charge.run_id: Spend(THREADS, 10 * THREADS, THREADS)}


def test_a_breaker_is_kept_as_its_last_change_left_it(ledger: SpendLedger) -> None:
    endpoint = f"http://127.0.0.1:9/v1 model-{uuid.uuid4().hex[:8]}"
    assert ledger.breaker(endpoint) is None
    # When the endpoint's breaker opens, then closes
    before = utcnow()
    ledger.breaker_changed(endpoint, "open", "connection refused", 30.0)
    opened = ledger.breaker(endpoint)
    ledger.breaker_changed(endpoint, "closed", "", 0.0)
    after = utcnow()
    # Then each change is kept, with when it happened, and other endpoints are untouched
    assert opened is not None and (opened.state, opened.reason, opened.cooldown_s) == (
        "open",
        "connection refused",
        30.0,
    )
    assert before <= opened.changed_at <= after
    closed = ledger.breaker(endpoint)
    assert closed is not None and (closed.state, closed.reason, closed.cooldown_s) == ("closed", "", 0.0)
    assert opened.changed_at <= closed.changed_at <= after
    assert ledger.breaker(endpoint + "-other") is None


def new_session() -> SessionKey:
    return SessionKey(tenant="t", user="u", session_id=f"s-{uuid.uuid4().hex[:12]}")


def test_a_dataset_sums_its_runs_and_searches_by_kind(ledger: SpendLedger) -> None:
    # Given a run's extraction and two searches' completions charged to one dataset, and a run of another
    dataset = f"d-{uuid.uuid4().hex[:12]}"
    run = Charge(run_id=f"run-{uuid.uuid4().hex[:12]}", dataset_id=dataset)
    searches = [Charge(f"search-{uuid.uuid4().hex[:12]}", dataset, "completion") for _ in range(2)]
    other = new_run()
    ledger.sent(f"{run.run_id}-1", run, "m", prompt_tokens=100, completion_tokens=10)
    for n, search in enumerate(searches):
        ledger.sent(f"{search.run_id}-1", search, "m", prompt_tokens=20 + n, completion_tokens=5)
    ledger.sent(f"{other.run_id}-1", other, "m", prompt_tokens=7)
    # Then the dataset's spend is each kind's, and nothing of the other's
    assert ledger.by_dataset([dataset, "never-charged"]) == {
        dataset: {"extraction": Spend(1, 100, 10), "completion": Spend(2, 41, 10)}
    }
    # And a search is a run of its own in `totals`
    assert ledger.totals([searches[0].run_id]) == {searches[0].run_id: Spend(1, 20, 5)}


def test_a_session_sums_what_was_charged_to_it_by_model(ledger: SpendLedger) -> None:
    # Given two searches of a session, on two models, one retried, and a search of no session
    session, other = new_session(), new_session()
    first = Charge(f"search-{uuid.uuid4().hex[:12]}", "d1", "completion", session)
    second = Charge(f"search-{uuid.uuid4().hex[:12]}", "d1", "completion", session)
    ledger.sent(f"{first.run_id}-1", first, "small", prompt_tokens=10, completion_tokens=1)
    ledger.answered(f"{first.run_id}-1", 0, 0)
    ledger.sent(f"{first.run_id}-2", first, "small", prompt_tokens=10, completion_tokens=1)
    ledger.sent(f"{second.run_id}-1", second, "large", prompt_tokens=30, completion_tokens=3)
    nobody = new_run()
    ledger.sent(f"{nobody.run_id}-1", nobody, "small", prompt_tokens=99)
    # Then the session's spend is by model, failed attempts named; the other session has none
    assert ledger.by_session([session, other]) == {
        session: {"small": Spend(2, 10, 1, failed=1), "large": Spend(1, 30, 3)}
    }


def test_a_run_started_for_a_session_is_charged_to_it_once(ledger: SpendLedger) -> None:
    # Given a run whose attempts were recorded with no session, and one attempt of another session
    session, elsewhere = new_session(), new_session()
    run = new_run()
    ledger.sent(f"{run.run_id}-1", run, "m", prompt_tokens=10, completion_tokens=1)
    ledger.sent(
        f"{run.run_id}-2", Charge(run.run_id, run.dataset_id, session=elsewhere), "m", prompt_tokens=5
    )
    # When the run is charged to the session, twice
    ledger.charge_run(run.run_id, session)
    ledger.charge_run(run.run_id, new_session())
    # Then the session holds the attempts no session held, and only those
    assert ledger.by_session([session]) == {session: {"m": Spend(1, 10, 1)}}
    assert ledger.by_session([elsewhere]) == {elsewhere: {"m": Spend(1, 5, 0)}}
    assert ledger.totals([run.run_id]) == {run.run_id: Spend(2, 15, 1)}
