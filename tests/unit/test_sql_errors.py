"""The one SQL error translator: which driver errors are worth a retry, over real sqlite3 and
psycopg errors."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import psycopg.errors
import pytest
import sqlalchemy as sa

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.storage.sql.engine import open_engine
from kenning.storage.sql.errors import translate, translated_sql
from tests.services import free_port

Provoke = Callable[[sa.Engine], object]
# The PostgreSQL test table: the session's database is shared by the tests.
TABLE = f"sql_errors_{uuid.uuid4().hex[:8]}"


def raised(engine: sa.Engine, provoke: Provoke) -> sa.exc.SQLAlchemyError:
    """The SQLAlchemy error that `provoke` raises against the engine."""
    with pytest.raises(sa.exc.SQLAlchemyError) as caught:
        provoke(engine)
    return caught.value


def run(*statements: str) -> Provoke:
    def provoke(engine: sa.Engine) -> None:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(sa.text(statement))

    return provoke


def bind(value: object) -> Provoke:
    def provoke(engine: sa.Engine) -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT :value"), {"value": value})

    return provoke


def wrapped(orig: Exception, base: type[Exception], *, invalidated: bool = False) -> sa.exc.SQLAlchemyError:
    """A driver error wrapped as SQLAlchemy wraps it (the class follows the driver's DB-API class)."""
    error = sa.exc.DBAPIError.instance("SELECT 1", None, orig, base, connection_invalidated=invalidated)
    assert isinstance(error, sa.exc.SQLAlchemyError)
    return error


def kind(error: sa.exc.SQLAlchemyError) -> type[StoreError]:
    translated = translate("a store", error)
    assert str(translated).startswith("a store: ")
    return type(translated)


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = open_engine(f"sqlite:///{tmp_path / 'errors.db'}")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL)"))
        conn.execute(sa.text("INSERT INTO t VALUES (1, 'a')"))
    yield engine
    engine.dispose()


@pytest.mark.parametrize(
    ("provoke", "expected"),
    [
        (run("SELECT * FROM missing"), StoreError),  # OperationalError, SQLITE_ERROR
        (run("SELEC 1"), StoreError),  # OperationalError, SQLITE_ERROR
        (run("INSERT INTO t VALUES (1, 'b')"), StoreError),  # IntegrityError, primary key
        (run("INSERT INTO t VALUES (2, NULL)"), StoreError),  # IntegrityError, NOT NULL
        (bind(object()), StoreError),  # a value sqlite3 cannot bind
    ],
    ids=["missing table", "syntax", "unique", "not null", "unbindable"],
)
def test_sqlite_errors(sqlite_engine: sa.Engine, provoke: Provoke, expected: type[StoreError]) -> None:
    assert kind(raised(sqlite_engine, provoke)) is expected


def test_a_locked_sqlite_database_is_transient(tmp_path: Path) -> None:
    # Given another connection holding the write lock, and an engine that does not wait for it
    path = tmp_path / "locked.db"
    sqlite3.connect(path).close()
    engine = sa.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        error = raised(engine, run("CREATE TABLE u (id INTEGER)"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        engine.dispose()
    # Then SQLITE_BUSY ("database is locked") is worth a retry
    assert isinstance(error.orig, sqlite3.OperationalError) and error.orig.sqlite_errorcode == 5  # type: ignore[attr-defined]
    assert kind(error) is TransientStoreError


def test_a_sqlite_file_that_cannot_be_opened_is_not_transient(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'no' / 'such' / 'folder.db'}")
    try:
        assert kind(raised(engine, run("SELECT 1"))) is StoreError  # SQLITE_CANTOPEN
    finally:
        engine.dispose()


def sqlite_error(code: int) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError("disk I/O error")
    error.sqlite_errorcode = code  # type: ignore[attr-defined]
    return error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (wrapped(sqlite_error(10), sqlite3.Error), TransientStoreError),  # SQLITE_IOERR
        (wrapped(sqlite_error(10 | 3 << 8), sqlite3.Error), TransientStoreError),  # SQLITE_IOERR_WRITE
        (wrapped(sqlite_error(6), sqlite3.Error), TransientStoreError),  # SQLITE_LOCKED
        (wrapped(sqlite_error(13), sqlite3.Error), StoreError),  # SQLITE_FULL
        (wrapped(psycopg.errors.SerializationFailure("conflict"), psycopg.Error), TransientStoreError),
        (wrapped(psycopg.errors.DeadlockDetected("deadlock"), psycopg.Error), TransientStoreError),
        (wrapped(psycopg.errors.TooManyConnections("too many"), psycopg.Error), TransientStoreError),
        (wrapped(psycopg.errors.AdminShutdown("shutdown"), psycopg.Error), TransientStoreError),
        (wrapped(psycopg.errors.ProgramLimitExceeded("row too big"), psycopg.Error), StoreError),
        (wrapped(psycopg.errors.InFailedSqlTransaction("aborted"), psycopg.Error), StoreError),
        (wrapped(psycopg.InterfaceError("the connection is closed"), psycopg.Error), StoreError),
        (
            wrapped(psycopg.InterfaceError("the connection is closed"), psycopg.Error, invalidated=True),
            TransientStoreError,
        ),
        (sa.exc.TimeoutError("QueuePool limit of size 5 overflow 10 reached"), TransientStoreError),
        (sa.exc.DisconnectionError("pre-ping failed"), TransientStoreError),
        (sa.exc.ResourceClosedError("This result object is closed."), StoreError),
    ],
    ids=[
        "sqlite ioerr",
        "sqlite extended ioerr",
        "sqlite locked",
        "sqlite full",
        "pg serialization",
        "pg deadlock",
        "pg too many connections",
        "pg admin shutdown",
        "pg program limit",
        "pg failed transaction",
        "interface, connection kept",
        "interface, connection lost",
        "pool timeout",
        "disconnection",
        "closed result",
    ],
)
def test_errors_the_drivers_raise_elsewhere(
    error: sa.exc.SQLAlchemyError, expected: type[StoreError]
) -> None:
    assert kind(error) is expected


def test_the_message_holds_the_driver_error_not_the_parameters(sqlite_engine: sa.Engine) -> None:
    with (
        pytest.raises(StoreError) as translated,
        translated_sql("graph database"),
        sqlite_engine.begin() as conn,
    ):
        conn.execute(sa.text("INSERT INTO t VALUES (1, :secret)"), {"secret": "a private note"})
    assert str(translated.value).startswith("graph database: IntegrityError: UNIQUE constraint failed")
    assert "a private note" not in str(translated.value)


@pytest.fixture
def postgres(postgres_url: str) -> Iterator[sa.Engine]:
    engine = open_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY, name TEXT NOT NULL)"))
        conn.execute(sa.text(f"INSERT INTO {TABLE} VALUES (1, 'a')"))
    yield engine
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {TABLE}"))
    engine.dispose()


def locked_out(engine: sa.Engine) -> None:
    """A row lock held by another transaction, waited for 10 ms at most: LockNotAvailable."""
    with engine.begin() as holder:
        holder.execute(sa.text(f"SELECT * FROM {TABLE} WHERE id = 1 FOR UPDATE"))
        run("SET LOCAL lock_timeout = '10ms'", f"UPDATE {TABLE} SET name = 'b' WHERE id = 1")(engine)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("provoke", "expected"),
    [
        (run(f"SELECT * FROM {TABLE}_missing"), StoreError),  # UndefinedTable
        (run("SELEC 1"), StoreError),  # SyntaxError
        (run(f"INSERT INTO {TABLE} VALUES (1, 'b')"), StoreError),  # UniqueViolation
        (run(f"INSERT INTO {TABLE} VALUES (2, NULL)"), StoreError),  # NotNullViolation
        (run(f"INSERT INTO {TABLE} VALUES (2, 'nul \x00 inside')"), StoreError),  # DataError
        (run("SET LOCAL statement_timeout = '10ms'", "SELECT pg_sleep(5)"), TransientStoreError),
        (locked_out, TransientStoreError),  # LockNotAvailable
    ],
    ids=["missing table", "syntax", "unique", "not null", "nul", "statement timeout", "lock timeout"],
)
def test_postgres_errors(postgres: sa.Engine, provoke: Provoke, expected: type[StoreError]) -> None:
    assert kind(raised(postgres, provoke)) is expected


@pytest.mark.postgres
def test_an_unreachable_postgres_is_transient() -> None:
    engine = open_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none?connect_timeout=5")
    try:
        assert kind(raised(engine, run("SELECT 1"))) is TransientStoreError
    finally:
        engine.dispose()
