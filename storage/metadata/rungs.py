"""The structured-output rung of each LLM endpoint and model (`kenning.pipeline.ladder.OutputRungs`):
in the SQL metadata database, and its in-memory twin (in `memory.py`)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.ladder import Rung, RungRecord
from kenning.pipeline.models import utcnow
from kenning.storage.metadata.schema import llm_output_rungs
from kenning.storage.sql.errors import translated_sql

WHAT = "output rungs"


class SqlOutputRungs:
    """`OutputRungs` in the `llm_output_rungs` table (run `kenning.storage.metadata.sql.migrate` first)."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def rung(self, endpoint: str, model: str) -> RungRecord | None:
        table = llm_output_rungs
        query = sa.select(table.c.rung, table.c.changed_at).where(
            table.c.endpoint == endpoint[:512], table.c.model == model[:255]
        )
        with translated_sql(WHAT), self._engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None or row[0] not in {rung.value for rung in Rung}:
            return None
        return RungRecord(endpoint=endpoint, model=model, rung=Rung(row[0]), changed_at=row[1])

    def remember_rung(self, endpoint: str, model: str, rung: Rung) -> None:
        row = {"endpoint": endpoint[:512], "model": model[:255], "rung": rung.value, "changed_at": utcnow()}
        insert = (postgresql if self._engine.dialect.name == "postgresql" else sqlite).insert(
            llm_output_rungs
        )
        upsert = insert.on_conflict_do_update(
            index_elements=["endpoint", "model"],
            set_={"rung": insert.excluded.rung, "changed_at": insert.excluded.changed_at},
        )
        with translated_sql(WHAT), self._engine.begin() as conn:
            conn.execute(upsert, [row])
