"""One way to open a SQLAlchemy engine for SQLite or PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url


def open_engine(url: str) -> sa.Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout, `secure_delete` (a deleted row's bytes
    are overwritten, not left in free pages) and its folder created."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})
    sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=60000")
    cursor.execute("PRAGMA secure_delete=ON")
    cursor.close()


def checkpoint(engine: sa.Engine) -> bool:
    """Copy SQLite's write-ahead log into the database and empty it, so that no older copy of a
    page (a deleted row's text) stays in the `-wal` file; whether it was done (False on another
    database, or when a reader kept part of the log). PostgreSQL's own WAL and dead rows are left
    to its checkpoints and autovacuum."""
    if not is_sqlite(engine):
        return False
    with engine.connect() as conn:
        busy, _log, _done = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").one()
    return not busy


def is_sqlite(engine: sa.Engine) -> bool:
    return engine.dialect.name == "sqlite"


def create_tables(engine: sa.Engine, metadata: sa.MetaData) -> None:
    try:
        metadata.create_all(engine)
    except (sa.exc.ProgrammingError, sa.exc.IntegrityError):
        # Another process created them between our check and our CREATE; now the check sees them.
        metadata.create_all(engine)
