"""The SQL spend ledger under many threads: every write committed before its call returns, fewer
transactions than writes."""

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
from kenning.pipeline.spend import Charge, Spend
from kenning.storage.metadata.spend import SqlSpendLedger
from kenning.storage.metadata.sql import migrate
from kenning.storage.sql.engine import open_engine
from tests.threads import at_once

THREADS = 16


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    url = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgres"
        else f"sqlite:///{tmp_path / 'm.db'}"
    )
    made = open_engine(url)
    migrate(made)
    yield made
    made.dispose()


def slow_first_commit(engine: sa.Engine) -> list[int]:
    """Counts the engine's commits; the first takes 0.3 s, so that writes queue behind it."""
    commits: list[int] = []

    def on_commit(_conn: Any) -> None:
        commits.append(1)
        if len(commits) == 1:
            time.sleep(0.3)

    sa.event.listen(engine, "commit", on_commit)
    return commits


def test_calls_sent_at_once_are_all_recorded_in_fewer_transactions(engine: sa.Engine) -> None:
    # Given a ledger whose first commit is slow, and one run's calls sent from many threads at once
    ledger = SqlSpendLedger(engine)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    charge = Charge(run_id=run_id, dataset_id="d1")
    ids = [f"{run_id}-{n}" for n in range(THREADS)]
    commits = slow_first_commit(engine)
    # When each thread records its call sent, then answered
    errors = at_once([partial(_call, ledger, attempt, charge) for attempt in ids])
    # Then every call and its tokens are recorded, in fewer transactions than writes
    assert errors == []
    assert ledger.totals([run_id])[run_id] == Spend(
        calls=THREADS, prompt_tokens=10 * THREADS, completion_tokens=THREADS
    )
    assert len(commits) < 2 * THREADS


def _call(ledger: SqlSpendLedger, attempt: str, charge: Charge) -> None:
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


def test_a_write_that_fails_fails_alone(engine: sa.Engine) -> None:
    # Given calls recorded at once from many threads, one of them under an attempt id already taken
    ledger = SqlSpendLedger(engine)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    charge = Charge(run_id=run_id, dataset_id="d1")
    ledger.sent(f"{run_id}-taken", charge, "sim")
    slow_first_commit(engine)
    calls = [partial(_call, ledger, f"{run_id}-{n}", charge) for n in range(THREADS - 1)]
    taken = partial(ledger.sent, f"{run_id}-taken", charge, "sim")
    # When they are recorded
    errors = at_once([taken, *calls])  # the last thread in leads: the taken id waits with the rest
    # Then only the one under the taken id failed, and every other call is recorded
    assert len(errors) == 1 and isinstance(errors[0], StoreError)
    assert ledger.totals([run_id])[run_id].calls == THREADS


def test_a_write_whose_transaction_was_interrupted_never_passes_for_committed(engine: sa.Engine) -> None:
    # Given a ledger whose first commit is slow, and a database call that is interrupted (an
    # exception that is not an error) when it writes one attempt
    ledger = SqlSpendLedger(engine)
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    charge = Charge(run_id=run_id, dataset_id="d1")
    doomed = f"{run_id}-doomed"

    def interrupt(_conn: Any, _cursor: Any, _statement: str, parameters: Any, *_rest: Any) -> None:
        if doomed in str(parameters):
            raise KeyboardInterrupt

    sa.event.listen(engine, "before_cursor_execute", interrupt)
    slow_first_commit(engine)
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
