"""The spend ledger's table as migrations make it equals the schema module's, from nothing and from
a database of the revision before (whose attempts were all extractions of no session)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from kenning.pipeline.spend import Spend
from kenning.storage.metadata.schema import metadata
from kenning.storage.metadata.spend import SqlSpendLedger
from kenning.storage.metadata.sql import MIGRATIONS, migrate
from kenning.storage.sql.engine import open_engine
from tests.services import scratch_database


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "sqlite":
        made = open_engine(f"sqlite:///{tmp_path / 'm.db'}")
        yield made
        made.dispose()
        return
    with scratch_database("kenning_spend_migration") as url:
        made = open_engine(url)
        yield made
        made.dispose()


def upgrade(engine: sa.Engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def differences(engine: sa.Engine) -> list[object]:
    with engine.connect() as connection:
        found = compare_metadata(MigrationContext.configure(connection), metadata)
    return [d for d in found if "llm_attempts" in repr(d)]


def test_the_migrated_ledger_table_is_the_schemas(engine: sa.Engine) -> None:
    migrate(engine)

    assert differences(engine) == []


def test_attempts_recorded_before_the_upgrade_count_as_extractions(engine: sa.Engine) -> None:
    # Given a database of the revision before, with an attempt of a run recorded in it
    upgrade(engine, "0007")
    run = f"run-{uuid.uuid4().hex[:8]}"
    row = {"id": "a1", "run_id": run, "dataset_id": "d1", "model": "m", "prompt_tokens": 9}
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO llm_attempts (id, run_id, dataset_id, model, prompt_tokens, completion_tokens, "
                "sent_at) VALUES (:id, :run_id, :dataset_id, :model, :prompt_tokens, 1, CURRENT_TIMESTAMP)"
            ),
            row,
        )
    # When it is migrated to the newest
    migrate(engine)
    # Then the attempt is its run's, and its dataset's extraction
    ledger = SqlSpendLedger(engine)
    assert ledger.totals([run]) == {run: Spend(1, 9, 1)}
    assert ledger.by_dataset(["d1"]) == {"d1": {"extraction": Spend(1, 9, 1)}}
    assert differences(engine) == []
