"""The graph in FalkorDB, over RESP with the `falkordb` client.

All scopes share one FalkorDB graph (`graph_name`); nodes and edges carry
`tenant` and `dataset` properties that every statement matches (see storage.cypher).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
import redis.exceptions
from falkordb import FalkorDB

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.storage.cypher import BATCH_SIZE, CypherGraphStore, Statement

DEFAULT_GRAPH = "kenning"


class FalkorGraphStore(CypherGraphStore):
    """A GraphStore in one FalkorDB graph, reached by `url` (falkor:// or redis://) or host and port.

    Nothing connects until the first call.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        password: str | None = None,
        graph_name: str = DEFAULT_GRAPH,
        batch_size: int = BATCH_SIZE,
        connect_timeout_s: float = 5.0,
    ) -> None:
        # The pool is ours, so close() can release its sockets; the client answers text.
        options: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": connect_timeout_s}
        if url:
            pool = redis.ConnectionPool.from_url(_redis_url(url), **options)
        else:
            pool = redis.ConnectionPool(host=host, port=port, password=password, **options)
        super().__init__(_FalkorRunner(pool, graph_name), batch_size)


def _redis_url(url: str) -> str:
    for scheme, redis_scheme in (("falkor://", "redis://"), ("falkors://", "rediss://")):
        if url.startswith(scheme):
            return redis_scheme + url.removeprefix(scheme)
    return url


class _FalkorRunner:
    def __init__(self, pool: redis.ConnectionPool, graph_name: str) -> None:
        self._pool = pool
        self._graph_name = graph_name
        self._graph_handle: Any = None
        self._lock = threading.Lock()

    def read(self, statement: Statement) -> list[list[Any]]:
        try:
            with _translated():
                return list(self._graph().ro_query(statement.query, statement.params).result_set)
        except StoreError as exc:
            # A graph that was never written to does not exist yet: it holds nothing.
            if "empty key" in str(exc.__cause__):
                return []
            raise

    def write(self, statement: Statement) -> list[list[Any]]:
        with _translated():
            return list(self._graph().query(statement.query, statement.params).result_set)

    def create_index(self, query: str) -> None:
        try:
            with _translated():
                self._graph().query(query)
        except StoreError as exc:
            if "already indexed" not in str(exc.__cause__):
                raise

    def close(self) -> None:
        with _translated():
            self._pool.disconnect()

    def _graph(self) -> Any:
        # The client talks to the server as soon as it is built, so it is built on first use.
        with self._lock:
            if self._graph_handle is None:
                self._graph_handle = FalkorDB(connection_pool=self._pool).select_graph(self._graph_name)
            return self._graph_handle


@contextmanager
def _translated() -> Iterator[None]:
    """Client errors become store errors; lost connections and timeouts are worth a retry."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise TransientStoreError(f"FalkorDB unavailable: {exc}") from exc
    except redis.exceptions.RedisError as exc:
        if "timed out" in str(exc).lower():
            raise TransientStoreError(f"FalkorDB query timed out: {exc}") from exc
        raise StoreError(f"FalkorDB error: {exc}") from exc
    except (ValueError, TypeError) as exc:
        # The client renders parameters into the query header and rejects what it cannot render.
        raise StoreError(f"FalkorDB cannot take these parameters: {exc}") from exc
