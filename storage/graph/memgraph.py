"""The graph in Memgraph, over Bolt with the official async `neo4j` driver.

The port is synchronous, so the driver lives on a private event loop in a daemon
thread and each call waits for its coroutine there. Queries come from storage.graph.cypher.

Every scope shares one Memgraph database: the store's own statements match `tenant` and
`dataset`, but Memgraph's community edition has neither a database per dataset nor
label-based access control, so nothing could confine a caller's own query to its
datasets. This store therefore offers no `read_query`, and CYPHER and NATURAL_LANGUAGE
searches are refused on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import neo4j
import neo4j.exceptions

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.pipeline.models import Scope
from kenning.storage.graph.cypher import BATCH_SIZE, CypherGraphStore, Statement

T = TypeVar("T")

_TRANSIENT = (
    neo4j.exceptions.ServiceUnavailable,
    neo4j.exceptions.SessionExpired,
    neo4j.exceptions.TransientError,
    neo4j.exceptions.ConnectionAcquisitionTimeoutError,
    OSError,
    TimeoutError,
    concurrent.futures.TimeoutError,
)


class MemgraphGraphStore(CypherGraphStore):
    """A GraphStore in Memgraph at `url` (bolt://host:7687); nothing connects until the first call.

    It runs no caller-written Cypher: one database holds every scope (see the module doc).
    """

    def __init__(
        self,
        url: str,
        user: str = "",
        password: str = "",
        *,
        batch_size: int = BATCH_SIZE,
        call_timeout_s: float = 300.0,
    ) -> None:
        super().__init__(_BoltRunner(url, user, password, call_timeout_s), batch_size)


class _BoltRunner:
    def __init__(self, url: str, user: str, password: str, call_timeout_s: float) -> None:
        self._timeout_s = call_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kenning-memgraph", daemon=True)
        self._thread.start()
        auth = (user, password) if user else None
        try:
            self._driver: neo4j.AsyncDriver = self._call(_open_driver(url, auth))
        except StoreError:
            self._stop_loop()
            raise
        self._closed = False

    def database(self, scope: Scope) -> str:
        return "memgraph"

    def read(self, scope: Scope, statement: Statement) -> list[list[Any]]:
        return self._call(self._transact(statement, write=False))

    def write(self, scope: Scope, statement: Statement) -> list[list[Any]]:
        return self._call(self._transact(statement, write=True))

    def create_index(self, scope: Scope, query: str) -> None:
        try:
            self._call(self._run_alone(query))
        except StoreError as exc:
            if "already" not in str(exc.__cause__).lower():
                raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._driver.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout=self._timeout_s)
        except _TRANSIENT as exc:
            future.cancel()
            raise TransientStoreError(f"Memgraph unavailable: {exc}") from exc
        except (neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError, ValueError) as exc:
            raise StoreError(f"Memgraph error: {exc}") from exc

    async def _transact(self, statement: Statement, write: bool) -> list[list[Any]]:
        async with self._driver.session() as session:
            if write:
                return await session.execute_write(_fetch, statement)
            return await session.execute_read(_fetch, statement)

    async def _run_alone(self, query: str) -> None:
        # Memgraph builds indexes only outside explicit transactions.
        async with self._driver.session() as session:
            result = await session.run(query)
            await result.consume()


async def _open_driver(url: str, auth: tuple[str, str] | None) -> neo4j.AsyncDriver:
    # Retries of a failed transaction stay well inside the call's own deadline.
    return neo4j.AsyncGraphDatabase.driver(
        url, auth=auth, connection_timeout=10.0, max_transaction_retry_time=15.0
    )


async def _fetch(tx: neo4j.AsyncManagedTransaction, statement: Statement) -> list[list[Any]]:
    result = await tx.run(statement.query, statement.params)
    return [list(record.values()) async for record in result]
