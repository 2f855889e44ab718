"""The metadata, chunk and extraction stores on SQLite or PostgreSQL, with SQLAlchemy Core."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.errors import ConfigError
from kenning.pipeline.models import (
    RUNNING,
    ChunkRecord,
    ChunkStatus,
    DataItem,
    Dataset,
    DocumentRecord,
    Extraction,
    ItemStatus,
    PipelineRun,
    RunStatus,
    Scope,
    utcnow,
)
from kenning.pipeline.ports import chunked
from kenning.storage.metadata.schema import (
    chunks,
    data_items,
    datasets,
    documents,
    extractions,
    pipeline_runs,
)
from kenning.storage.sql.errors import translated_sql

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# A run's fields that a save of it as still running leaves alone once it was cancelled (while its
# runner was recording a step, say): the runner's counters are taken, the cancel is kept.
ENDURES = ("status", "error", "finished_at")
# Rows per INSERT and ids per IN list: well under SQLite's bound-parameter limit.
BATCH = 500
# One PostgreSQL advisory lock serialises workers that start (and migrate) at the same time.
MIGRATION_LOCK = zlib.crc32(b"kenning.metadata.migrate")
SUPPORTED = ("sqlite", "postgresql")
WHAT = "metadata store"


# Alembic's version table for the metadata tables (storage/metadata/migrations/env.py names it).
VERSION_TABLE = "metadata_alembic_version"
REVISION = re.compile(r"^(down_)?revision\b[^=]*=\s*(None|[\"']([^\"']+)[\"'])", re.MULTILINE)


def migrate(engine: sa.Engine) -> None:
    """Bring the metadata tables to the newest revision; safe to call on every startup.

    A database already at the newest revision costs one read: alembic (a second to import)
    is loaded only when there is something to upgrade.
    """
    newest = newest_revision()
    if newest is not None and stored_revision(engine) == newest:
        return
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    with translated_sql(WHAT), engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK)))
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def newest_revision() -> str | None:
    """The one revision of storage/metadata/migrations no other revision follows; None if unclear."""
    revisions: set[str] = set()
    followed: set[str] = set()
    for script in (MIGRATIONS / "versions").glob("*.py"):
        found = {match[0]: match[2] for match in REVISION.findall(script.read_text())}
        if not found.get(""):
            return None
        revisions.add(found[""])
        followed.update(value for key, value in found.items() if key and value)
    heads = revisions - followed
    return heads.pop() if len(heads) == 1 else None


def stored_revision(engine: sa.Engine) -> str | None:
    """The revision the database is at; None if it has none (or it cannot be read)."""
    table = sa.table(VERSION_TABLE, sa.column("version_num"))
    try:
        with engine.connect() as conn:
            versions = conn.scalars(sa.select(table.c.version_num)).all()
    except sa.exc.SQLAlchemyError:
        return None
    return str(versions[0]) if len(versions) == 1 else None


class SqlMetadataStore:
    """MetadataStore, ChunkStore and ExtractionCache on one engine.

    The tables must exist: call `migrate(engine)` once at startup. Each call runs in
    one transaction; driver errors come out as StoreError or TransientStoreError.
    """

    def __init__(self, engine: sa.Engine) -> None:
        if engine.dialect.name not in SUPPORTED:
            raise ConfigError(f"metadata store: unsupported database {engine.dialect.name!r}")
        self._engine = engine

    # Datasets

    def ensure_dataset(self, scope: Scope) -> Dataset:
        dataset = Dataset.of(scope)
        with self._begin() as conn:
            conn.execute(self._insert_ignoring(datasets), dataset.model_dump())
            row = conn.execute(sa.select(datasets).where(datasets.c.id == dataset.id)).one()
        return Dataset.model_validate(dict(row._mapping))

    def get_dataset(self, scope: Scope) -> Dataset | None:
        query = sa.select(datasets).where(datasets.c.tenant == scope.tenant, datasets.c.name == scope.dataset)
        with self._begin() as conn:
            row = conn.execute(query).one_or_none()
        return None if row is None else Dataset.model_validate(dict(row._mapping))

    def list_datasets(self, tenant: str) -> list[Dataset]:
        query = sa.select(datasets).where(datasets.c.tenant == tenant).order_by(datasets.c.name)
        with self._begin() as conn:
            return [Dataset.model_validate(dict(row._mapping)) for row in conn.execute(query)]

    # Data items

    def add_item(self, item: DataItem) -> bool:
        """Store the item; False when the dataset already holds the same content."""
        # RETURNING says whether the row went in; rowcount is not reliable across drivers.
        insert = self._insert_ignoring(data_items).returning(data_items.c.id)
        with self._begin() as conn:
            return conn.execute(insert, item.model_dump()).first() is not None

    def list_items(self, dataset_id: str, status: ItemStatus | None = None) -> list[DataItem]:
        query = sa.select(data_items).where(data_items.c.dataset_id == dataset_id)
        if status is not None:
            query = query.where(data_items.c.status == status.value)
        query = query.order_by(data_items.c.created_at, data_items.c.id)
        with self._begin() as conn:
            return [DataItem.model_validate(dict(row._mapping)) for row in conn.execute(query)]

    def get_items(self, item_ids: Sequence[str]) -> list[DataItem]:
        """The items found, in the order of `item_ids`."""
        rows = self._select_by_ids(data_items, item_ids)
        return [DataItem.model_validate(rows[item_id]) for item_id in item_ids if item_id in rows]

    def set_item_status(self, item_id: str, status: ItemStatus, error: str = "") -> None:
        """Set the item's status and error; an unknown id changes nothing."""
        update = (
            sa.update(data_items).where(data_items.c.id == item_id).values(status=status.value, error=error)
        )
        with self._begin() as conn:
            conn.execute(update)

    def set_items_status(self, item_ids: Sequence[str], status: ItemStatus) -> None:
        if not item_ids:
            return
        with self._begin() as conn:
            for batch in chunked(item_ids, BATCH):
                where = data_items.c.id.in_(batch)
                conn.execute(sa.update(data_items).where(where).values(status=status.value, error=""))

    def delete_items(self, dataset_id: str, item_ids: Sequence[str]) -> None:
        """Delete the items with their documents and chunks, in one transaction."""
        with self._begin() as conn:
            for batch in chunked(item_ids, BATCH):
                for table, column in ((chunks, chunks.c.data_id), (documents, documents.c.data_id)):
                    conn.execute(sa.delete(table).where(table.c.dataset_id == dataset_id, column.in_(batch)))
                where = sa.and_(data_items.c.dataset_id == dataset_id, data_items.c.id.in_(batch))
                conn.execute(sa.delete(data_items).where(where))

    def contents_in_use(self, content_hashes: Sequence[str]) -> set[str]:
        return self._values_in_use(data_items.c.content_hash, content_hashes)

    def delete_dataset(self, dataset_id: str) -> None:
        with self._begin() as conn:
            conn.execute(sa.delete(pipeline_runs).where(pipeline_runs.c.dataset_id == dataset_id))
            conn.execute(sa.delete(datasets).where(datasets.c.id == dataset_id))

    # Pipeline runs

    def save_run(self, run: PipelineRun) -> None:
        """Insert or overwrite the run; but a cancelled run stays cancelled (see `ENDURES`)."""
        with self._begin() as conn:
            conn.execute(self._run_upsert(), run.model_dump())

    def _run_upsert(self) -> sa.Insert:
        # One statement: a cancel that lands between a runner's read and its write is kept.
        if self._engine.dialect.name == "postgresql":
            pg = postgresql.insert(pipeline_runs)
            return pg.on_conflict_do_update(index_elements=["id"], set_=_run_values(pg.excluded))
        lite = sqlite.insert(pipeline_runs)
        return lite.on_conflict_do_update(index_elements=["id"], set_=_run_values(lite.excluded))

    def get_run(self, run_id: str) -> PipelineRun | None:
        with self._begin() as conn:
            row = conn.execute(sa.select(pipeline_runs).where(pipeline_runs.c.id == run_id)).one_or_none()
        return None if row is None else PipelineRun.model_validate(dict(row._mapping))

    def list_runs(self, dataset_id: str) -> list[PipelineRun]:
        query = (
            sa.select(pipeline_runs)
            .where(pipeline_runs.c.dataset_id == dataset_id)
            .order_by(pipeline_runs.c.started_at, pipeline_runs.c.id)
        )
        with self._begin() as conn:
            return [PipelineRun.model_validate(dict(row._mapping)) for row in conn.execute(query)]

    def list_running_runs(self) -> list[tuple[Dataset, PipelineRun]]:
        running = [status.value for status in RUNNING]
        query = (
            sa.select(datasets, pipeline_runs)
            .join(datasets, datasets.c.id == pipeline_runs.c.dataset_id)
            .where(pipeline_runs.c.status.in_(running))
            .order_by(pipeline_runs.c.started_at, pipeline_runs.c.id)
        )
        with self._begin() as conn:
            rows = conn.execute(query).all()
        width = len(datasets.columns)
        return [
            (
                Dataset.model_validate(dict(zip(datasets.columns.keys(), row[:width], strict=True))),
                PipelineRun.model_validate(dict(zip(pipeline_runs.columns.keys(), row[width:], strict=True))),
            )
            for row in rows
        ]

    # Documents and chunks

    def save_documents(self, documents_: Sequence[DocumentRecord]) -> None:
        """Insert or overwrite the documents, by id."""
        rows = [document.model_dump() for document in documents_]
        self._execute_batches(self._upserting(documents, "id"), rows)

    def list_documents(self, dataset_id: str, data_ids: Sequence[str] | None = None) -> list[DocumentRecord]:
        """The dataset's documents (of those data items only, when given), by data id then id."""
        query = sa.select(documents).where(documents.c.dataset_id == dataset_id)
        with self._begin() as conn:
            if data_ids is None:
                rows = list(conn.execute(query))
            else:
                batches = (query.where(documents.c.data_id.in_(batch)) for batch in chunked(data_ids, BATCH))
                rows = [row for batch_query in batches for row in conn.execute(batch_query)]
        records = [DocumentRecord.model_validate(dict(row._mapping)) for row in rows]
        return sorted(records, key=lambda record: (record.data_id, record.id))

    def save_chunks(self, chunks_: Sequence[ChunkRecord]) -> None:
        """Insert new chunks; chunks already stored keep their text and status."""
        self._execute_batches(self._insert_ignoring(chunks), [chunk_row(chunk) for chunk in chunks_])

    def get_chunks(self, chunk_ids: Sequence[str]) -> list[ChunkRecord]:
        """The chunks found, in the order of `chunk_ids`."""
        rows = self._select_by_ids(chunks, chunk_ids)
        return [chunk_record(rows[chunk_id]) for chunk_id in chunk_ids if chunk_id in rows]

    def list_chunk_ids(self, dataset_id: str, status: ChunkStatus | None = None) -> list[str]:
        """The dataset's chunk ids ordered by (document id, index)."""
        query = sa.select(chunks.c.id).where(chunks.c.dataset_id == dataset_id)
        if status is not None:
            query = query.where(chunks.c.status == status.value)
        query = query.order_by(chunks.c.document_id, chunks.c.chunk_index)
        with self._begin() as conn:
            return list(conn.scalars(query))

    def data_ids_with_chunks(self, dataset_id: str, statuses: Sequence[ChunkStatus]) -> set[str]:
        wanted = [status.value for status in statuses]
        query = sa.select(chunks.c.data_id).distinct()
        query = query.where(chunks.c.dataset_id == dataset_id, chunks.c.status.in_(wanted))
        with self._begin() as conn:
            return set(conn.scalars(query))

    def chunks_of(self, dataset_id: str, data_ids: Sequence[str]) -> list[ChunkRecord]:
        query = sa.select(chunks).where(chunks.c.dataset_id == dataset_id)
        with self._begin() as conn:
            rows = [
                row
                for batch in chunked(data_ids, BATCH)
                for row in conn.execute(query.where(chunks.c.data_id.in_(batch)))
            ]
        found = [chunk_record(dict(row._mapping)) for row in rows]
        return sorted(found, key=lambda chunk: (chunk.document_id, chunk.index))

    def text_hashes_in_use(self, text_hashes: Sequence[str], tenant: str | None = None) -> set[str]:
        if tenant is None:
            return self._values_in_use(chunks.c.text_hash, text_hashes)
        found: set[str] = set()
        of_tenant = sa.select(datasets.c.id).where(datasets.c.tenant == tenant)
        with self._begin() as conn:
            for batch in chunked(sorted(set(text_hashes)), BATCH):
                query = sa.select(chunks.c.text_hash).where(
                    chunks.c.text_hash.in_(batch), chunks.c.dataset_id.in_(of_tenant)
                )
                found.update(conn.scalars(query.distinct()))
        return found

    def set_chunk_status(self, chunk_ids: Sequence[str], status: ChunkStatus, error: str = "") -> None:
        """Set status and error of every chunk listed; unknown ids are skipped."""
        with self._begin() as conn:
            for batch in chunked(chunk_ids, BATCH):
                update = sa.update(chunks).where(chunks.c.id.in_(batch))
                conn.execute(update.values(status=status.value, error=error))

    # Extraction cache

    def get_extractions(self, keys: Sequence[str]) -> dict[str, Extraction]:
        """The cached extractions of those keys that are present."""
        rows = self._select_by_ids(extractions, keys, key="key")
        return {key: Extraction.model_validate(row["value"]) for key, row in rows.items()}

    def put_extractions(self, extractions_: dict[str, Extraction]) -> None:
        now = utcnow()
        rows = [
            {"key": key, "value": extraction.model_dump(mode="json"), "created_at": now}
            for key, extraction in extractions_.items()
        ]
        self._execute_batches(self._upserting(extractions, "key"), rows)

    def delete_extractions(self, keys: Sequence[str]) -> None:
        with self._begin() as conn:
            for batch in chunked(keys, BATCH):
                conn.execute(sa.delete(extractions).where(extractions.c.key.in_(batch)))

    # Plumbing

    def _values_in_use(self, column: sa.Column[Any], values: Sequence[str]) -> set[str]:
        found: set[str] = set()
        with self._begin() as conn:
            for batch in chunked(sorted(set(values)), BATCH):
                found.update(conn.scalars(sa.select(column).where(column.in_(batch)).distinct()))
        return found

    @contextmanager
    def _begin(self) -> Iterator[sa.Connection]:
        with translated_sql(WHAT), self._engine.begin() as conn:
            yield conn

    def _execute_batches(self, statement: sa.Insert, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run `statement` over the rows, BATCH rows per executemany, in one transaction."""
        if not rows:
            return
        with self._begin() as conn:
            for start in range(0, len(rows), BATCH):
                conn.execute(statement, list(rows[start : start + BATCH]))

    def _select_by_ids(
        self, table: sa.Table, ids: Sequence[str], key: str = "id"
    ) -> dict[str, Mapping[str, Any]]:
        column = table.c[key]
        found: dict[str, Mapping[str, Any]] = {}
        with self._begin() as conn:
            for batch in chunked(ids, BATCH):
                for row in conn.execute(sa.select(table).where(column.in_(batch))):
                    found[row._mapping[key]] = dict(row._mapping)
        return found

    def _insert_ignoring(self, table: sa.Table) -> sa.Insert:
        """INSERT that skips rows clashing with any unique key."""
        if self._engine.dialect.name == "postgresql":
            return postgresql.insert(table).on_conflict_do_nothing()
        return sqlite.insert(table).on_conflict_do_nothing()

    def _upserting(self, table: sa.Table, key: str) -> sa.Insert:
        """INSERT that overwrites every other column of a row with the same `key`."""
        names = [column.name for column in table.columns if column.name != key]
        if self._engine.dialect.name == "postgresql":
            pg = postgresql.insert(table)
            return pg.on_conflict_do_update(index_elements=[key], set_={n: pg.excluded[n] for n in names})
        lite = sqlite.insert(table)
        return lite.on_conflict_do_update(index_elements=[key], set_={n: lite.excluded[n] for n in names})


def _run_values(excluded: Any) -> dict[str, Any]:
    """The columns an upsert of a run sets: its new values, except `ENDURES` of a cancelled run
    saved again as running."""
    running = [status.value for status in RUNNING]
    keep = sa.and_(pipeline_runs.c.status == RunStatus.CANCELLED.value, excluded.status.in_(running))
    values = {column.name: excluded[column.name] for column in pipeline_runs.columns if column.name != "id"}
    values.update({name: sa.case((keep, pipeline_runs.c[name]), else_=excluded[name]) for name in ENDURES})
    return values


def chunk_row(chunk: ChunkRecord) -> dict[str, Any]:
    row = chunk.model_dump(exclude={"index"})
    row["chunk_index"] = chunk.index
    return row


def chunk_record(row: Mapping[str, Any]) -> ChunkRecord:
    values = dict(row)
    values["index"] = values.pop("chunk_index")
    return ChunkRecord.model_validate(values)
