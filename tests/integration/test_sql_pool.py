"""PostgreSQL connections from the pool: pinged when idle, not before every transaction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from kenning.storage.sql import engine as sql_engine
from tests.services import POSTGRES_ADMIN_URL, scratch_database


@pytest.fixture
def engine() -> Iterator[sa.Engine]:
    with scratch_database() as url:
        made = sql_engine.open_engine(url)
        try:
            yield made
        finally:
            made.dispose()


def counting_pings(engine: sa.Engine) -> list[int]:
    """Count the engine's pings (the checkout listener calls the dialect's `do_ping`)."""
    pings: list[int] = []
    real = engine.dialect.do_ping

    def do_ping(dbapi_connection: Any) -> bool:
        pings.append(1)
        return bool(real(dbapi_connection))

    engine.dialect.do_ping = do_ping  # type: ignore[method-assign]
    return pings


def backend_pid(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def test_transactions_one_after_another_do_not_ping_the_server_each_time(engine: sa.Engine) -> None:
    # Given a pool whose connection has been used
    pings = counting_pings(engine)
    first = backend_pid(engine)
    # When ten transactions follow at once
    pids = [backend_pid(engine) for _ in range(10)]
    # Then they ran on the same connection, with no round trip to ping it
    assert set(pids) == {first}
    assert pings == []


def test_an_idle_pooled_connection_whose_server_session_ended_is_replaced_before_use(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a pooled connection whose server session was ended (a restart, an idle timeout)
    pings = counting_pings(engine)
    gone = backend_pid(engine)
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": gone}).scalar_one()
    admin.dispose()
    # When it is next used, having been idle longer than the window (here: any time at all)
    monkeypatch.setattr(sql_engine, "PING_IDLE_S", 0.0)
    replaced = backend_pid(engine)
    # Then the ping found it gone and the work ran on a new connection, without an error
    assert pings and replaced != gone
