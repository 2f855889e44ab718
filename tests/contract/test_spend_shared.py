"""A request charged to several datasets (a search that read them) counts in each dataset's spend,
and once in every sum over datasets, runs and sessions: for every SpendLedger, and in the table
the migrations make."""

from __future__ import annotations

import uuid
from pathlib import Path

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from kenning.pipeline.session import SessionKey
from kenning.pipeline.spend import Charge, Spend, SpendLedger, charged_to, current_charge
from kenning.storage.metadata.schema import metadata
from kenning.storage.metadata.sql import migrate
from kenning.storage.sql.engine import open_engine
from tests.contract.test_spend_ledger import ledger

__all__ = ["ledger"]  # the fixture: every SpendLedger


def named(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_a_search_of_several_datasets_counts_in_each_and_once_in_every_sum(ledger: SpendLedger) -> None:
    # Given a search that read three datasets, answered in two requests of a session
    a, b, c, elsewhere = named("a"), named("b"), named("c"), named("x")
    session = SessionKey(tenant="t", user="u", session_id=named("s"))
    search = Charge(named("search"), a, "completion", session, shared=(b, c))
    ledger.sent(f"{search.run_id}-1", search, "m", prompt_tokens=30, completion_tokens=3)
    ledger.sent(f"{search.run_id}-2", search, "m", prompt_tokens=20, completion_tokens=2)
    # And a run's extraction of one of them, and a search of another dataset
    run = Charge(named("run"), b)
    ledger.sent(f"{run.run_id}-1", run, "m", prompt_tokens=100, completion_tokens=10)
    other = Charge(named("search"), elsewhere, "completion")
    ledger.sent(f"{other.run_id}-1", other, "m", prompt_tokens=7, completion_tokens=1)
    # Then each dataset the search read is charged all of it
    searched = Spend(2, 50, 5)
    assert ledger.by_dataset([a, b, c]) == {
        a: {"completion": searched},
        b: {"completion": searched, "extraction": Spend(1, 100, 10)},
        c: {"completion": searched},
    }
    # And a sum over the datasets counts each request once, however many of them it was charged to
    assert ledger.across([a, b, c]) == {"completion": searched, "extraction": Spend(1, 100, 10)}
    assert ledger.across([c]) == {"completion": searched}
    assert ledger.across([a, elsewhere]) == {"completion": searched + Spend(1, 7, 1)}
    assert ledger.across([named("never")]) == {} and ledger.across([]) == {}
    # And so do the search's own total and its session's
    assert ledger.totals([search.run_id]) == {search.run_id: searched}
    assert ledger.by_session([session]) == {session: {"m": searched}}


def test_a_charge_names_each_other_dataset_once() -> None:
    with charged_to("search-1", "a", "completion", ["b", "a", "c", "b"]):
        charge = current_charge()
    assert charge is not None and (charge.dataset_id, charge.shared) == ("a", ("b", "c"))


def test_the_migrated_shares_table_is_the_schemas(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'm.db'}")
    try:
        migrate(engine)
        with engine.connect() as connection:
            found = compare_metadata(MigrationContext.configure(connection), metadata)
        assert [d for d in found if "llm_attempt_datasets" in repr(d)] == []
        assert "llm_attempt_datasets" in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
