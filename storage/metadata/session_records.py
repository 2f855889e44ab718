"""The lasting records of agent sessions in the metadata database (SQLite or PostgreSQL)."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.models import utcnow
from kenning.pipeline.session import ModelUsage, SessionKey, SessionRecord
from kenning.storage.metadata.schema import sessions
from kenning.storage.sql.errors import translated_sql

WHAT = "session records"


class SqlSessionRecords:
    """SessionRecords in the `sessions` table; it must exist: run `metadata_sql.migrate(engine)` first.

    `touch` inserts the row if missing, then reads it locked and writes it back in the same
    transaction, so concurrent touches of one session all count.
    """

    def __init__(self, engine: sa.Engine, clock: Callable[[], datetime] = utcnow) -> None:
        self._engine = engine
        self._clock = clock

    def touch(
        self,
        key: SessionKey,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
        model: str = "",
        error: str = "",
    ) -> SessionRecord:
        now = self._clock()
        fresh = SessionRecord(key=key, started_at=now, last_activity_at=now)
        insert = postgresql.insert if self._engine.dialect.name == "postgresql" else sqlite.insert
        with translated_sql(WHAT), self._engine.begin() as conn:
            # On SQLite the INSERT takes the database's write lock even when the row exists, so
            # the read below cannot go stale; on PostgreSQL the row lock of FOR UPDATE does that.
            conn.execute(insert(sessions).values(_row(fresh)).on_conflict_do_nothing())
            row = conn.execute(sa.select(sessions).where(*_match(key)).with_for_update()).one()
            record = _record(row).used(now, tokens_in, tokens_out, cost, model, error)
            conn.execute(sa.update(sessions).where(*_match(key)).values(_row(record)))
        return record

    def end(self, key: SessionKey) -> bool:
        ended_at = sa.func.coalesce(sessions.c.ended_at, sa.literal(self._clock(), sessions.c.ended_at.type))
        with translated_sql(WHAT), self._engine.begin() as conn:
            result = conn.execute(
                sa.update(sessions).where(*_match(key)).values(status="ended", ended_at=ended_at)
            )
        return bool(result.rowcount)

    def get(self, key: SessionKey) -> SessionRecord | None:
        with translated_sql(WHAT), self._engine.connect() as conn:
            row = conn.execute(sa.select(sessions).where(*_match(key))).one_or_none()
        return _record(row) if row is not None else None

    def list(self, tenant: str, user: str | None = None) -> builtins.list[SessionRecord]:
        query = sa.select(sessions).where(sessions.c.tenant == tenant)
        if user is not None:
            query = query.where(sessions.c.user_id == user)
        order = (sessions.c.last_activity_at.desc(), sessions.c.user_id, sessions.c.session_id)
        with translated_sql(WHAT), self._engine.connect() as conn:
            rows = conn.execute(query.order_by(*order)).all()
        return [_record(row) for row in rows]


def _match(key: SessionKey) -> tuple[sa.ColumnElement[bool], ...]:
    return (
        sessions.c.tenant == key.tenant,
        sessions.c.user_id == key.user,
        sessions.c.session_id == key.session_id,
    )


def _row(record: SessionRecord) -> dict[str, Any]:
    return {
        "tenant": record.key.tenant,
        "user_id": record.key.user,
        "session_id": record.key.session_id,
        "status": record.status,
        "started_at": record.started_at,
        "last_activity_at": record.last_activity_at,
        "ended_at": record.ended_at,
        "tokens_in": record.tokens_in,
        "tokens_out": record.tokens_out,
        "estimated_cost": record.estimated_cost,
        "errors": record.errors,
        "last_error": record.last_error,
        "models": {name: usage.model_dump() for name, usage in record.models.items()},
    }


def _record(row: sa.Row[Any]) -> SessionRecord:
    return SessionRecord(
        key=SessionKey(tenant=row.tenant, user=row.user_id, session_id=row.session_id),
        status=row.status,
        started_at=row.started_at,
        last_activity_at=row.last_activity_at,
        ended_at=row.ended_at,
        tokens_in=row.tokens_in,
        tokens_out=row.tokens_out,
        estimated_cost=row.estimated_cost,
        errors=row.errors,
        last_error=row.last_error,
        models={name: ModelUsage.model_validate(usage) for name, usage in row.models.items()},
    )
