"""One way to open a SQLAlchemy engine for SQLite or PostgreSQL."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url


def open_engine(url: str) -> sa.Engine:
    """An engine for `url`; SQLite gets WAL, a busy timeout, `secure_delete` (a deleted row's bytes
    are overwritten, not left in free pages) and its folder created."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        engine = sa.create_engine(url, pool_size=5, max_overflow=10)
        sa.event.listen(engine, "checkout", functools.partial(_ping_if_idle, engine.dialect))
        sa.event.listen(engine, "checkin", _note_use)
        return engine
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})
    sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


# A pooled connection given back within this many seconds is taken as alive. One idle longer is
# pinged before it is used and replaced if its server went away. Pinging every checkout cost a
# round trip per transaction; a server restarted within the window fails the next statement once
# (a transient store error, which the pool answers by opening new connections).
PING_IDLE_S = 1.0
_USED = "kenning_used_at"


def _ping_if_idle(dialect: sa.Dialect, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    used = record.info.get(_USED)
    if used is None:
        return  # new
    idle_s = time.monotonic() - used
    if idle_s < PING_IDLE_S:
        return  # given back a moment ago
    try:
        dialect.do_ping(dbapi_connection)
    except Exception as error:
        # The pool drops this connection and checks out another.
        raise sa.exc.DisconnectionError(f"a pooled connection idle {idle_s:.0f} s is gone") from error


def _note_use(_dbapi_connection: Any, record: Any) -> None:
    if record is not None:
        record.info[_USED] = time.monotonic()


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
    except (sa.exc.ProgrammingError, sa.exc.IntegrityError, sa.exc.OperationalError) as error:
        # Another process created them between our check and our CREATE (PostgreSQL says so with
        # the first two, SQLite with an OperationalError); now the check sees them.
        if isinstance(error, sa.exc.OperationalError) and "already exists" not in str(error.orig):
            raise
        metadata.create_all(engine)
