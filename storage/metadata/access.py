"""The access log of retrieved elements: in the SQL metadata database, and its in-memory twin."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.ports import chunked
from kenning.storage.metadata.schema import element_access
from kenning.storage.sql.errors import translated_sql

BATCH = 500


class SqlAccessLog:
    """AccessLog in the `element_access` table (run `kenning.storage.metadata.sql.migrate` first)."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def record(self, dataset_id: str, counts: dict[str, int], at: datetime) -> None:
        if not counts:
            return
        rows = [
            {"dataset_id": dataset_id, "element_id": key, "last_access": at, "count": n}
            for key, n in counts.items()
        ]
        insert = (postgresql if self._engine.dialect.name == "postgresql" else sqlite).insert(element_access)
        table = element_access
        upsert = insert.on_conflict_do_update(
            index_elements=["dataset_id", "element_id"],
            set_={
                "last_access": sa.case(
                    (insert.excluded.last_access > table.c.last_access, insert.excluded.last_access),
                    else_=table.c.last_access,
                ),
                "count": table.c.count + insert.excluded.count,
            },
        )
        with translated_sql("access log"), self._engine.begin() as conn:
            for start in range(0, len(rows), BATCH):
                conn.execute(upsert, rows[start : start + BATCH])

    def accesses(self, dataset_id: str, element_ids: Sequence[str]) -> dict[str, tuple[datetime, int]]:
        table = element_access
        found: dict[str, tuple[datetime, int]] = {}
        with translated_sql("access log"), self._engine.connect() as conn:
            for batch in chunked(list(element_ids), BATCH):
                query = sa.select(table.c.element_id, table.c.last_access, table.c.count).where(
                    table.c.dataset_id == dataset_id, table.c.element_id.in_(batch)
                )
                found.update((row[0], (row[1], int(row[2]))) for row in conn.execute(query))
        return found

    def forget_access(self, dataset_id: str, element_ids: Sequence[str] | None = None) -> None:
        table = element_access
        mine = table.c.dataset_id == dataset_id
        with translated_sql("access log"), self._engine.begin() as conn:
            if element_ids is None:
                conn.execute(sa.delete(table).where(mine))
                return
            for batch in chunked(list(element_ids), BATCH):
                conn.execute(sa.delete(table).where(mine, table.c.element_id.in_(batch)))


class MemoryAccessLog:
    """The in-memory twin of SqlAccessLog."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], tuple[datetime, int]] = {}
        self._lock = threading.Lock()

    def record(self, dataset_id: str, counts: dict[str, int], at: datetime) -> None:
        with self._lock:
            for key, n in counts.items():
                last, count = self._seen.get((dataset_id, key), (at, 0))
                self._seen[(dataset_id, key)] = (max(last, at), count + n)

    def accesses(self, dataset_id: str, element_ids: Sequence[str]) -> dict[str, tuple[datetime, int]]:
        with self._lock:
            seen = self._seen
            return {key: seen[(dataset_id, key)] for key in element_ids if (dataset_id, key) in seen}

    def forget_access(self, dataset_id: str, element_ids: Sequence[str] | None = None) -> None:
        with self._lock:
            for dataset, key in list(self._seen):
                if dataset == dataset_id and (element_ids is None or key in element_ids):
                    del self._seen[(dataset, key)]
