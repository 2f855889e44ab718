"""One contract for the metadata, chunk and extraction stores: memory, SQLite and PostgreSQL."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Protocol

import pytest
import sqlalchemy as sa

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.pipeline.models import (
    ChunkRecord,
    ChunkStatus,
    DataItem,
    Dataset,
    DocumentRecord,
    Extraction,
    ItemStatus,
    KnowledgeEdge,
    KnowledgeGraph,
    KnowledgeNode,
    PipelineRun,
    RunStatus,
    Scope,
    content_hash,
    stable_id,
)
from kenning.pipeline.ports import ChunkStore, ExtractionCache, MetadataStore
from kenning.storage.metadata.memory import MemoryMetadataStore
from kenning.storage.metadata.schema import metadata
from kenning.storage.metadata.sql import SqlMetadataStore, migrate
from kenning.storage.sql.engine import open_engine
from tests.services import ROOT, free_port, scratch_database

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SQL_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Store(MetadataStore, ChunkStore, ExtractionCache, Protocol):
    """What the SQL store and its twin both are."""


@pytest.fixture(scope="module")
def postgres_engine(postgres_url: str) -> Iterator[sa.Engine]:
    """One migrated engine on the session's database; tests keep apart by unique tenants and keys."""
    engine = open_engine(postgres_url)
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture(params=SQL_BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "postgres":
        yield request.getfixturevalue("postgres_engine")
        return
    sqlite_engine = open_engine(f"sqlite:///{tmp_path / 'metadata.db'}")
    migrate(sqlite_engine)
    yield sqlite_engine
    sqlite_engine.dispose()


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryMetadataStore()
        return
    if request.param == "postgres":
        yield SqlMetadataStore(request.getfixturevalue("postgres_engine"))
        return
    sqlite_engine = open_engine(f"sqlite:///{tmp_path / 'metadata.db'}")
    migrate(sqlite_engine)
    yield SqlMetadataStore(sqlite_engine)
    sqlite_engine.dispose()


@pytest.fixture
def scope() -> Scope:
    """A tenant no other test uses: a clean slate on the shared PostgreSQL database."""
    return Scope(tenant=f"tenant-{uuid.uuid4().hex[:12]}", dataset="docs")


def make_item(dataset: Dataset, data: bytes, name: str = "a.txt") -> DataItem:
    return DataItem.of(dataset, name=name, source=f"file:///{name}", data=data, mime="text/plain")


def make_chunk(dataset: Dataset, document_id: str, index: int, text: str = "") -> ChunkRecord:
    text = text or f"chunk {index} of {document_id}"
    return ChunkRecord(
        id=stable_id(dataset.id, document_id, str(index)),
        dataset_id=dataset.id,
        document_id=document_id,
        data_id=f"data-{document_id}",
        index=index,
        text=text,
        token_count=len(text.split()),
        text_hash=content_hash(text.encode()),
    )


def make_extraction(summary: str) -> Extraction:
    graph = KnowledgeGraph(
        nodes=[
            KnowledgeNode(id="ada", name="Ada Lovelace", type="Person", description="mathematician"),
            KnowledgeNode(id="engine", name="Analytical Engine", type="Machine"),
        ],
        edges=[KnowledgeEdge(source="ada", target="engine", relationship="wrote_about", description="x")],
    )
    return Extraction(graph=graph, summary=summary)


# Datasets


def test_ensure_dataset_creates_once_and_keeps_the_first_record(store: Store, scope: Scope) -> None:
    first = store.ensure_dataset(scope)
    again = store.ensure_dataset(scope)

    assert first == again
    assert (first.id, first.tenant, first.name) == (Dataset.of(scope).id, scope.tenant, scope.dataset)
    assert first.created_at.tzinfo is not None
    assert store.get_dataset(scope) == first


def test_get_dataset_of_an_unknown_scope_is_none(store: Store, scope: Scope) -> None:
    assert store.get_dataset(scope) is None


def test_list_datasets_gives_the_tenants_datasets_by_name(store: Store, scope: Scope) -> None:
    other_tenant = Scope(tenant=f"{scope.tenant}-other", dataset="docs")
    for name in ("zeta", "alpha", "mid"):
        store.ensure_dataset(Scope(tenant=scope.tenant, dataset=name))
    store.ensure_dataset(other_tenant)

    listed = store.list_datasets(scope.tenant)

    assert [dataset.name for dataset in listed] == ["alpha", "mid", "zeta"]
    assert store.list_datasets(f"{scope.tenant}-nobody") == []


# Data items


def test_add_item_dedups_content_within_a_dataset_only(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    other = store.ensure_dataset(Scope(tenant=scope.tenant, dataset="other"))

    assert store.add_item(make_item(dataset, b"same bytes", "a.txt")) is True
    assert store.add_item(make_item(dataset, b"same bytes", "b.txt")) is False
    assert store.add_item(make_item(other, b"same bytes", "a.txt")) is True

    assert [item.name for item in store.list_items(dataset.id)] == ["a.txt"]
    assert len(store.list_items(other.id)) == 1


def test_add_item_refuses_other_content_under_a_known_content_hash(store: Store, scope: Scope) -> None:
    # Given an item, when one with another id but the same (dataset, content hash) comes
    dataset = store.ensure_dataset(scope)
    item = make_item(dataset, b"payload")
    store.add_item(item)
    twin = item.model_copy(update={"id": stable_id("another", "id"), "name": "renamed.txt"})

    # Then it is a duplicate, and the first one stays as it was
    assert store.add_item(twin) is False
    assert store.get_items([item.id, twin.id]) == [item]


def test_items_round_trip_with_every_field(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    plus_two = timezone(timedelta(hours=2))
    item = make_item(dataset, b"x" * 10).model_copy(
        update={"created_at": datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=plus_two), "size": 5_000_000_000}
    )

    store.add_item(item)
    [stored] = store.get_items([item.id])

    assert stored == item
    assert stored.created_at == datetime(2024, 5, 6, 5, 8, 9, 123456, tzinfo=UTC)
    assert stored.status is ItemStatus.PENDING


def test_get_items_keeps_the_order_asked_and_skips_unknown_ids(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    items = [make_item(dataset, f"data {n}".encode(), f"{n}.txt") for n in range(5)]
    for item in items:
        store.add_item(item)

    wanted = [items[3].id, "missing", items[0].id, items[4].id]

    assert [item.id for item in store.get_items(wanted)] == [items[3].id, items[0].id, items[4].id]
    assert store.get_items([]) == []


def test_list_items_is_in_creation_order_and_filters_by_status(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    items = [
        make_item(dataset, f"data {n}".encode(), f"{n}.txt").model_copy(
            update={"created_at": start + timedelta(minutes=n)}
        )
        for n in (2, 0, 1)
    ]
    for item in items:
        store.add_item(item)

    store.set_item_status(items[0].id, ItemStatus.FAILED, error="cannot parse")
    store.set_item_status(items[1].id, ItemStatus.DONE)

    assert [item.name for item in store.list_items(dataset.id)] == ["0.txt", "1.txt", "2.txt"]
    [failed] = store.list_items(dataset.id, ItemStatus.FAILED)
    assert (failed.id, failed.error) == (items[0].id, "cannot parse")
    assert [item.name for item in store.list_items(dataset.id, ItemStatus.PENDING)] == ["1.txt"]


def test_set_item_status_clears_the_error_and_ignores_unknown_ids(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    item = make_item(dataset, b"flaky")
    store.add_item(item)
    store.set_item_status(item.id, ItemStatus.FAILED, error="timeout")

    store.set_item_status(item.id, ItemStatus.CLASSIFIED)
    store.set_item_status("no-such-item", ItemStatus.DONE)

    [stored] = store.get_items([item.id])
    assert (stored.status, stored.error) == (ItemStatus.CLASSIFIED, "")


def test_set_items_status_sets_many_at_once_and_clears_their_errors(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    items = [make_item(dataset, f"item {n}".encode()) for n in range(3)]
    for item in items:
        store.add_item(item)
    store.set_item_status(items[0].id, ItemStatus.FAILED, error="timeout")

    store.set_items_status([items[0].id, items[1].id, "no-such-item"], ItemStatus.CHUNKED)

    found = {item.id: item for item in store.get_items([item.id for item in items])}
    assert [(found[item.id].status, found[item.id].error) for item in items] == [
        (ItemStatus.CHUNKED, ""),
        (ItemStatus.CHUNKED, ""),
        (ItemStatus.PENDING, ""),
    ]


def test_concurrent_add_of_the_same_content_stores_one_item(store: Store, scope: Scope) -> None:
    # Given eight workers adding the same bytes at the same moment
    dataset = store.ensure_dataset(scope)
    workers = 8
    start = threading.Barrier(workers, timeout=30)

    def add(n: int) -> bool:
        start.wait()
        return store.add_item(make_item(dataset, b"the same upload", f"copy-{n}.txt"))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(add, n) for n in range(workers)]
        added = [future.result(timeout=120) for future in futures]

    # Then exactly one of them stored it
    assert added.count(True) == 1
    assert len(store.list_items(dataset.id)) == 1


# Pipeline runs


def test_save_run_upserts_by_id(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    run = PipelineRun(id=f"run-{uuid.uuid4().hex}", dataset_id=dataset.id)
    store.save_run(run)

    finished = run.model_copy(
        update={
            "status": RunStatus.COMPLETED,
            "step": "load",
            "stats": {"chunks": 12, "entities": 40},
            "finished_at": run.started_at + timedelta(seconds=3),
        }
    )
    store.save_run(finished)

    assert store.get_run(run.id) == finished
    assert store.list_runs(dataset.id) == [finished]


def test_list_runs_is_in_start_order_and_scoped_to_the_dataset(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    other = store.ensure_dataset(Scope(tenant=scope.tenant, dataset="other"))
    start = datetime(2024, 1, 1, tzinfo=UTC)
    runs = [
        PipelineRun(
            id=f"run-{n}-{uuid.uuid4().hex}", dataset_id=dataset.id, started_at=start + timedelta(hours=n)
        )
        for n in (1, 0, 2)
    ]
    for run in runs:
        store.save_run(run)
    store.save_run(PipelineRun(id=f"run-other-{uuid.uuid4().hex}", dataset_id=other.id))

    assert [run.started_at.hour for run in store.list_runs(dataset.id)] == [0, 1, 2]
    assert store.get_run("no-such-run") is None
    assert store.list_runs("no-such-dataset") == []


def test_list_running_runs_gives_the_runs_not_ended_of_every_tenant_with_their_dataset(
    store: Store, scope: Scope
) -> None:
    # Given runs of two tenants' datasets, started, ended and not yet started
    first = store.ensure_dataset(scope)
    second = store.ensure_dataset(Scope(tenant=f"{scope.tenant}-b", dataset="other"))
    mine = {first.id, second.id}
    statuses = {
        f"run-{status.value}-{uuid.uuid4().hex}": status
        for status in (RunStatus.STARTED, RunStatus.COMPLETED, RunStatus.INTERRUPTED, RunStatus.INITIATED)
    }
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for n, (run_id, status) in enumerate(statuses.items()):
        dataset = first if n % 2 == 0 else second
        at = start + timedelta(hours=n)
        store.save_run(PipelineRun(id=run_id, dataset_id=dataset.id, status=status, started_at=at))

    # Then the runs not ended come, oldest first, each with its own dataset
    running = [(dataset, run) for dataset, run in store.list_running_runs() if dataset.id in mine]
    assert [(dataset.id, run.status) for dataset, run in running] == [
        (first.id, RunStatus.STARTED),
        (second.id, RunStatus.INITIATED),
    ]
    assert running[1][0].tenant == f"{scope.tenant}-b" and running[1][0].name == "other"


# Documents


def test_documents_are_saved_overwritten_and_listed_by_data_item(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    documents = [
        DocumentRecord(
            id=f"doc-{n}-{scope.tenant}",
            dataset_id=dataset.id,
            data_id=f"data-{n}",
            name=f"{n}.md",
            kind="text",
        )
        for n in (2, 0, 1)
    ]
    store.save_documents(documents)
    renamed = documents[0].model_copy(update={"name": "renamed.md", "mime": "text/markdown"})
    store.save_documents([renamed])

    listed = store.list_documents(dataset.id)
    assert [document.data_id for document in listed] == ["data-0", "data-1", "data-2"]
    assert listed[2] == renamed
    assert [d.data_id for d in store.list_documents(dataset.id, ["data-2", "data-0"])] == ["data-0", "data-2"]
    assert store.list_documents(dataset.id, []) == []
    assert store.list_documents("no-such-dataset") == []


# Chunks


def test_save_chunks_leaves_stored_chunks_untouched(store: Store, scope: Scope) -> None:
    # Given a chunk that extraction already marked
    dataset = store.ensure_dataset(scope)
    chunk = make_chunk(dataset, "doc-a", 0)
    store.save_chunks([chunk])
    store.set_chunk_status([chunk.id], ChunkStatus.EXTRACTED)

    # When a re-run saves it again (with a reset status and other text) along with a new one
    rerun = chunk.model_copy(update={"status": ChunkStatus.PENDING, "text": "rewritten"})
    fresh = make_chunk(dataset, "doc-a", 1)
    store.save_chunks([rerun, fresh])

    # Then the stored one keeps its status and text, and the new one is added
    stored, added = store.get_chunks([chunk.id, fresh.id])
    assert stored == chunk.model_copy(update={"status": ChunkStatus.EXTRACTED})
    assert added == fresh


def test_list_chunk_ids_orders_by_document_then_index(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    chunks = [make_chunk(dataset, document, index) for document in ("doc-b", "doc-a") for index in range(12)]
    shuffled = list(chunks)
    random.Random(7).shuffle(shuffled)
    store.save_chunks(shuffled)

    expected = sorted(chunks, key=lambda chunk: (chunk.document_id, chunk.index))
    assert store.list_chunk_ids(dataset.id) == [chunk.id for chunk in expected]
    assert store.list_chunk_ids("no-such-dataset") == []


def test_chunk_status_is_set_for_many_and_filters_the_listing(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    chunks = [make_chunk(dataset, "doc-a", index) for index in range(6)]
    store.save_chunks(chunks)

    store.set_chunk_status([chunks[4].id, chunks[1].id, "unknown"], ChunkStatus.LOADED)
    store.set_chunk_status([chunks[5].id], ChunkStatus.FAILED, error="llm refused")

    assert store.list_chunk_ids(dataset.id, ChunkStatus.LOADED) == [chunks[1].id, chunks[4].id]
    assert store.list_chunk_ids(dataset.id, ChunkStatus.PENDING) == [chunks[n].id for n in (0, 2, 3)]
    [failed] = store.get_chunks([chunks[5].id])
    assert (failed.status, failed.error) == (ChunkStatus.FAILED, "llm refused")
    assert store.list_chunk_ids(dataset.id, ChunkStatus.EXTRACTED) == []


def test_data_ids_with_chunks_in_given_statuses(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    chunks = [
        make_chunk(dataset, document, index) for document in ("doc-a", "doc-b", "doc-c") for index in range(2)
    ]
    store.save_chunks(chunks)
    store.set_chunk_status([chunk.id for chunk in chunks if chunk.document_id != "doc-a"], ChunkStatus.LOADED)
    store.set_chunk_status([chunks[3].id], ChunkStatus.FAILED)

    assert store.data_ids_with_chunks(dataset.id, [ChunkStatus.PENDING]) == {"data-doc-a"}
    assert store.data_ids_with_chunks(dataset.id, [ChunkStatus.PENDING, ChunkStatus.FAILED]) == {
        "data-doc-a",
        "data-doc-b",
    }
    assert store.data_ids_with_chunks(dataset.id, [ChunkStatus.LOADED]) == {"data-doc-b", "data-doc-c"}
    assert store.data_ids_with_chunks(dataset.id, [ChunkStatus.EXTRACTED]) == set()
    assert store.data_ids_with_chunks(dataset.id, []) == set()
    assert store.data_ids_with_chunks("no-such-dataset", [ChunkStatus.PENDING]) == set()


def test_large_chunk_batches_are_stored_whole(store: Store, scope: Scope) -> None:
    # Given more chunks than one insert batch holds, with about 4 MB of text
    dataset = store.ensure_dataset(scope)
    chunks = [make_chunk(dataset, f"doc-{n % 3}", n, text=f"{n} " + "word " * 700) for n in range(1_234)]

    store.save_chunks(chunks)
    store.set_chunk_status([chunk.id for chunk in chunks[:1_100]], ChunkStatus.EXTRACTED)

    assert len(store.list_chunk_ids(dataset.id)) == 1_234
    assert len(store.list_chunk_ids(dataset.id, ChunkStatus.EXTRACTED)) == 1_100
    fetched = store.get_chunks([chunk.id for chunk in chunks])
    assert [chunk.text for chunk in fetched] == [chunk.text for chunk in chunks]


def test_get_chunks_keeps_the_order_asked(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    chunks = [make_chunk(dataset, "doc-a", index) for index in range(4)]
    store.save_chunks(chunks)

    wanted = [chunks[2].id, "missing", chunks[0].id]

    assert store.get_chunks(wanted) == [chunks[2], chunks[0]]
    assert store.get_chunks([]) == []


# Extraction cache


def test_extraction_cache_returns_only_the_keys_present(store: Store) -> None:
    prefix = uuid.uuid4().hex
    cached = {f"{prefix}:gpt:v1:{n}": make_extraction(f"summary {n}") for n in range(3)}
    store.put_extractions(cached)

    found = store.get_extractions([f"{prefix}:gpt:v1:2", f"{prefix}:missing", f"{prefix}:gpt:v1:0"])

    assert found == {key: cached[key] for key in (f"{prefix}:gpt:v1:2", f"{prefix}:gpt:v1:0")}
    assert store.get_extractions([]) == {}


def test_put_extractions_overwrites_by_key(store: Store) -> None:
    key = f"{uuid.uuid4().hex}:gpt:v1:hash"
    store.put_extractions({key: make_extraction("first")})

    store.put_extractions({key: make_extraction("second")})

    assert store.get_extractions([key])[key].summary == "second"


def test_many_extractions_round_trip(store: Store) -> None:
    prefix = uuid.uuid4().hex
    cached = {f"{prefix}:{n}": make_extraction(f"summary {n}") for n in range(1_100)}

    store.put_extractions(cached)

    assert store.get_extractions(list(cached)) == cached


# The SQL store only


def test_migration_runs_again_without_error(engine: sa.Engine, scope: Scope) -> None:
    migrate(engine)
    migrate(engine)

    store = SqlMetadataStore(engine)
    assert store.ensure_dataset(scope).tenant == scope.tenant
    tables = set(sa.inspect(engine).get_table_names())
    assert set(metadata.tables) | {"metadata_alembic_version"} <= tables
    assert not any(name.startswith("graph_") for name in metadata.tables)


def test_store_without_tables_raises_a_store_error(tmp_path: Path, scope: Scope) -> None:
    # Given a database nobody migrated, the failure is a StoreError that a retry cannot fix
    engine = open_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        with pytest.raises(StoreError) as raised:
            SqlMetadataStore(engine).ensure_dataset(scope)
        assert not isinstance(raised.value, TransientStoreError)
        assert isinstance(raised.value.__cause__, sa.exc.SQLAlchemyError)
    finally:
        engine.dispose()


def test_locked_sqlite_database_is_a_transient_error(tmp_path: Path, scope: Scope) -> None:
    # Given another connection holding the write lock, and a store that does not wait for it
    path = tmp_path / "locked.db"
    setup = open_engine(f"sqlite:///{path}")
    migrate(setup)
    setup.dispose()
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(TransientStoreError):
            SqlMetadataStore(engine).ensure_dataset(scope)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        engine.dispose()


@pytest.mark.postgres
def test_unreachable_postgres_is_a_transient_error(scope: Scope) -> None:
    engine = open_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none?connect_timeout=5")
    try:
        with pytest.raises(TransientStoreError):
            SqlMetadataStore(engine).get_dataset(scope)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_driver_errors_do_not_leak_from_postgres(postgres_engine: sa.Engine, scope: Scope) -> None:
    # PostgreSQL text cannot hold NUL characters: the failure must still be a store error
    store = SqlMetadataStore(postgres_engine)
    dataset = store.ensure_dataset(scope)

    with pytest.raises(StoreError):
        store.save_chunks([make_chunk(dataset, "doc-a", 0, text="nul \x00 inside")])

    assert store.list_chunk_ids(dataset.id) == []


@pytest.fixture
def fresh_postgres_url(postgres_url: str) -> Iterator[str]:
    """A database of its own, empty, for a migration from nothing."""
    with scratch_database("kenning_migrate") as url:
        yield url


@pytest.mark.postgres
def test_workers_starting_together_migrate_once(fresh_postgres_url: str) -> None:
    # Given four worker processes that all migrate an empty database at startup
    script = (
        "import sys\n"
        "from kenning.storage.metadata.sql import migrate\n"
        "from kenning.storage.sql.engine import open_engine\n"
        "migrate(open_engine(sys.argv[1]))\n"
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script, fresh_postgres_url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [worker.communicate(timeout=120)[0] for worker in workers]

    # Then every one of them succeeds and the schema is at its single head
    assert [worker.returncode for worker in workers] == [0, 0, 0, 0], outputs
    engine = open_engine(fresh_postgres_url)
    try:
        with engine.connect() as conn:
            versions = conn.scalars(sa.text("SELECT version_num FROM metadata_alembic_version")).all()
        assert versions == [head_revision()]
    finally:
        engine.dispose()


def head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from kenning.storage.metadata.sql import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return str(ScriptDirectory.from_config(config).get_current_head())


# Deleting


def test_delete_items_takes_their_documents_and_chunks_and_nothing_else(store: Store, scope: Scope) -> None:
    # Given two items, each with a document and chunks
    dataset = store.ensure_dataset(scope)
    first, second = make_item(dataset, b"first"), make_item(dataset, b"second", "b.txt")
    for item in (first, second):
        store.add_item(item)
        document = DocumentRecord(
            id=f"doc-{item.id}", dataset_id=dataset.id, data_id=item.id, name=item.name, kind="text"
        )
        store.save_documents([document])
        store.save_chunks(
            [
                make_chunk(dataset, f"doc-{item.id}", n, f"{item.name} {n}").model_copy(
                    update={"data_id": item.id}
                )
                for n in range(2)
            ]
        )
    first_hashes = [chunk.text_hash for chunk in store.chunks_of(dataset.id, [first.id])]
    assert len(first_hashes) == 2

    # When the first item is deleted
    store.delete_items(dataset.id, [first.id, "unknown"])

    # Then only the second remains, and only its content and chunk texts are in use
    assert [item.id for item in store.list_items(dataset.id)] == [second.id]
    assert [d.data_id for d in store.list_documents(dataset.id)] == [second.id]
    assert {c.data_id for c in store.chunks_of(dataset.id, [first.id, second.id])} == {second.id}
    assert store.contents_in_use([first.content_hash, second.content_hash]) == {second.content_hash}
    assert store.text_hashes_in_use(first_hashes) == set()
    # And the same content can be added again
    assert store.add_item(make_item(dataset, b"first"))


def test_delete_extractions_and_dataset(store: Store, scope: Scope) -> None:
    dataset = store.ensure_dataset(scope)
    store.put_extractions({"k1": make_extraction("one"), "k2": make_extraction("two")})
    store.delete_extractions(["k1", "missing"])
    assert set(store.get_extractions(["k1", "k2"])) == {"k2"}

    store.delete_dataset(dataset.id)
    assert store.get_dataset(scope) is None
