"""One translation of SQL errors (SQLAlchemy over sqlite3 or psycopg) into store errors, for every
SQL adapter: the metadata, chunk and extraction stores, the graph and lexical tables, the spend
ledger, the access log, permissions and session records."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from kenning.pipeline.errors import StoreError, TransientStoreError

# SQLite reports nearly everything as OperationalError, a missing table or a syntax error included
# (a database nobody migrated must not be retried for ever). Of its primary result codes, only
# these may go away on a retry: SQLITE_BUSY (5, "database is locked": another connection writes),
# SQLITE_LOCKED (6, a table locked within the connection), SQLITE_IOERR (10) and SQLITE_PROTOCOL (15,
# a WAL lock race).
SQLITE_TRANSIENT_CODES = frozenset({5, 6, 10, 15})
# psycopg raises OperationalError for connection failures and for the server's SQLSTATE classes 08
# (connection), 40 (serialization failure, deadlock), 53 (insufficient resources: too many
# connections), 55 (lock not available), 57 (cancelled by a timeout, server shutting down): all
# may pass. Class 54 (program limit exceeded: a row or statement too large) is the same on a retry.
POSTGRES_LASTING_CLASSES = frozenset({"54"})


@contextmanager
def translated_sql(what: str) -> Iterator[None]:
    """SQLAlchemy errors inside the block become store errors naming `what` (`translate`)."""
    try:
        yield
    except sa.exc.SQLAlchemyError as exc:
        raise translate(what, exc) from exc


def translate(what: str, exc: sa.exc.SQLAlchemyError) -> StoreError:
    """`TransientStoreError` when a retry may succeed (`is_transient`), else `StoreError`. The
    message holds the driver's error, not the statement and its parameters (which hold data)."""
    detail = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
    message = f"{what}: {type(exc).__name__}: {detail}"
    return TransientStoreError(message) if is_transient(exc) else StoreError(message)


def is_transient(exc: sa.exc.SQLAlchemyError) -> bool:
    """Whether a retry may succeed: a connection lost or refused, a pool that had none free, a lock
    or a serialization conflict, a statement cancelled by a timeout. Never an integrity,
    programming, data or interface error (a constraint, a missing table, a value the column
    cannot hold, a value the driver cannot bind) unless the connection was lost with it."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, sa.exc.TimeoutError | sa.exc.DisconnectionError):
        return True
    if not isinstance(exc, sa.exc.OperationalError):
        return False
    code = getattr(exc.orig, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in SQLITE_TRANSIENT_CODES
    sqlstate = getattr(exc.orig, "sqlstate", None) or ""
    return sqlstate[:2] not in POSTGRES_LASTING_CLASSES
