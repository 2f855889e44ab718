"""Two processes opening one new store create its tables at once: the one that loses the race
finds them made, whatever the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from kenning.storage.sql.engine import create_tables, open_engine
from tests.services import scratch_database


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'kenning.db'}"
        return
    with scratch_database() as made:
        yield made


def test_tables_another_process_created_between_the_check_and_the_create_are_taken(url: str) -> None:
    # Given a table that another process creates after this one checked it was missing
    metadata = sa.MetaData()
    table = sa.Table("graph_revisions", metadata, sa.Column("id", sa.String, primary_key=True))
    engine, other = open_engine(url), open_engine(url)
    raced: list[bool] = []

    def other_process_first(target: sa.Table, connection: Any, **_: Any) -> None:
        if not raced:
            raced.append(True)
            theirs = sa.MetaData()
            sa.Table(target.name, theirs, sa.Column("id", sa.String, primary_key=True))
            theirs.create_all(other)

    sa.event.listen(table, "before_create", other_process_first)
    try:
        # When this process creates the tables
        create_tables(engine, metadata)
        # Then it ends without an error, the table there
        assert raced and sa.inspect(engine).has_table("graph_revisions")
    finally:
        engine.dispose()
        other.dispose()
