"""One contract for the structured-output rung store: memory, SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from kenning.pipeline.ladder import OutputRungs, Rung
from kenning.storage.metadata.memory import MemoryOutputRungs
from kenning.storage.metadata.rungs import SqlOutputRungs
from kenning.storage.metadata.sql import migrate
from kenning.storage.sql.engine import open_engine

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def rungs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OutputRungs]:
    if request.param == "memory":
        yield MemoryOutputRungs()
        return
    url = (
        request.getfixturevalue("postgres_url")
        if request.param == "postgres"
        else f"sqlite:///{tmp_path}/m.db"
    )
    engine = open_engine(url)
    migrate(engine)
    yield SqlOutputRungs(engine)
    engine.dispose()


@pytest.fixture
def endpoint() -> str:
    """An endpoint no other test uses: a clean slate on the shared PostgreSQL database."""
    return f"http://127.0.0.1:8080/{uuid.uuid4().hex[:8]}/v1"


def test_nothing_is_remembered_at_first(rungs: OutputRungs, endpoint: str) -> None:
    assert rungs.rung(endpoint, "qwen") is None


def test_a_rung_is_remembered_per_endpoint_and_model(rungs: OutputRungs, endpoint: str) -> None:
    rungs.remember_rung(endpoint, "qwen", Rung.JSON_OBJECT)
    rungs.remember_rung(endpoint, "llama", Rung.PROMPT)

    qwen, llama = rungs.rung(endpoint, "qwen"), rungs.rung(endpoint, "llama")
    assert qwen is not None and qwen.rung is Rung.JSON_OBJECT
    assert llama is not None and llama.rung is Rung.PROMPT
    assert rungs.rung(endpoint + "/other", "qwen") is None


def test_remembering_again_replaces_the_rung(rungs: OutputRungs, endpoint: str) -> None:
    rungs.remember_rung(endpoint, "qwen", Rung.JSON_SCHEMA)
    first = rungs.rung(endpoint, "qwen")
    rungs.remember_rung(endpoint, "qwen", Rung.JSON_OBJECT)

    found = rungs.rung(endpoint, "qwen")
    assert first is not None and found is not None
    assert found.rung is Rung.JSON_OBJECT and found.changed_at >= first.changed_at


def test_a_second_process_reads_what_the_first_remembered(tmp_path: Path) -> None:
    # Two engines on one database file stand for two processes sharing the metadata database.
    url = f"sqlite:///{tmp_path}/shared.db"
    first, second = open_engine(url), open_engine(url)
    try:
        migrate(first)
        SqlOutputRungs(first).remember_rung("http://127.0.0.1:8080/v1", "qwen", Rung.JSON_OBJECT)
        found = SqlOutputRungs(second).rung("http://127.0.0.1:8080/v1", "qwen")
    finally:
        first.dispose()
        second.dispose()
    assert found is not None and found.rung is Rung.JSON_OBJECT


def test_the_migrated_table_is_the_schemas(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path}/m.db")
    try:
        migrate(engine)
        columns = {column["name"] for column in sa.inspect(engine).get_columns("llm_output_rungs")}
    finally:
        engine.dispose()
    assert columns == {"endpoint", "model", "rung", "changed_at"}
