"""The graph in FalkorDB, over RESP with the `falkordb` client.

Each (tenant, dataset) scope lives in a FalkorDB graph of its own, named from
`graph_name` and the scope (see `graph_key`), so a query run on a scope's graph can
read nothing of any other scope, whatever it says. Nodes and edges still carry
`tenant` and `dataset` properties that every statement matches (see storage.graph.cypher).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import redis
import redis.exceptions
from falkordb import FalkorDB

from kenning.pipeline.errors import InputError, QueryBudgetExceeded, StoreError, TransientStoreError
from kenning.pipeline.models import Scope
from kenning.storage.graph.cypher import BATCH_SIZE, CypherGraphStore, Statement, plain_value

log = logging.getLogger(__name__)
DEFAULT_GRAPH = "kenning"
DEFAULT_TIMEOUT_MS = 5000
DEFAULT_MAX_ROWS = 200
# What FalkorDB answers when a query runs past its timeout or QUERY_MEM_CAPACITY.
_OVER_BUDGET = ("query timed out", "mem consumption exceeded capacity")


class FalkorGraphStore(CypherGraphStore):
    """A GraphStore in FalkorDB, reached by `url` (falkor:// or redis://) or host and port,
    with one graph per scope. Nothing connects until the first call.

    The server keeps the last MAX_INFO_QUERIES queries of each graph, parameters (chunk text)
    included, in a `telemetry{graph}` stream, unless started with CMD_INFO off (that setting
    does nothing once the server runs). Unless `query_telemetry`, the first connection sets
    MAX_INFO_QUERIES to 0 (for the whole server), so that no stream is written from then on,
    and `erase_deleted` drops a scope's stream written before.
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
        call_timeout_s: float = 300.0,
        query_telemetry: bool = False,
    ) -> None:
        # The pool is ours, so close() can release its sockets; the client answers text. The
        # call timeout outlasts every query budget, so that the server, not the socket, ends a query.
        options: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": connect_timeout_s,
            "socket_timeout": call_timeout_s,
        }
        if url:
            pool = redis.ConnectionPool.from_url(_redis_url(url), **options)
        else:
            pool = redis.ConnectionPool(host=host, port=port, password=password, **options)
        self._falkor = _FalkorRunner(pool, graph_name, query_telemetry)
        super().__init__(self._falkor, batch_size)

    def erase_deleted(self, scope: Scope) -> int:
        """Drop the scope's query telemetry stream, which may quote deleted text; 1 if it was there."""
        return self._falkor.drop_telemetry(scope)

    def read_query(
        self,
        scope: Scope,
        query: str,
        params: dict[str, Any] | None = None,
        *,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        max_rows: int = DEFAULT_MAX_ROWS,
    ) -> list[dict[str, Any]]:
        """Run a caller's read-only query on the scope's own graph, which holds no other scope.

        The server refuses writes on this path, stops the query after `timeout_ms` (or past
        its QUERY_MEM_CAPACITY) with QueryBudgetExceeded, and returns at most `max_rows`
        rows. `$tenant` and `$dataset` are bound to the scope. Each row is a dict by column
        name (columns in name order); nodes and relationships come back as property dicts.
        """
        # The server applies the LIMIT; the newlines end any `//` comment the query ends with.
        bounded = f"CALL {{\n{query}\n}}\nRETURN * LIMIT {max(int(max_rows), 0)}"
        bound = {**(params or {}), "tenant": scope.tenant, "dataset": scope.dataset}
        columns, rows = self._falkor.read_bounded(scope, Statement(bounded, bound), timeout_ms)
        return [dict(zip(columns, map(plain_value, row), strict=True)) for row in rows]


def graph_key(graph_name: str, scope: Scope) -> str:
    """The FalkorDB graph that holds `scope`: `graph_name:tenant:dataset`, each name
    percent-encoded, so that two scopes never share a graph."""
    return ":".join(quote(part, safe="") for part in (graph_name, scope.tenant, scope.dataset))


def telemetry_key(graph: str) -> str:
    """The stream where FalkorDB keeps a graph's recent queries and their parameters."""
    return f"telemetry{{{graph}}}"


def _redis_url(url: str) -> str:
    for scheme, redis_scheme in (("falkor://", "redis://"), ("falkors://", "rediss://")):
        if url.startswith(scheme):
            return redis_scheme + url.removeprefix(scheme)
    return url


class _FalkorRunner:
    def __init__(self, pool: redis.ConnectionPool, graph_name: str, query_telemetry: bool) -> None:
        self._pool = pool
        self._graph_name = graph_name
        self._query_telemetry = query_telemetry
        self._client: Any = None
        self._graphs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def database(self, scope: Scope) -> str:
        return graph_key(self._graph_name, scope)

    def read(self, scope: Scope, statement: Statement) -> list[list[Any]]:
        return self._read(scope, statement, None)[1]

    def read_bounded(
        self, scope: Scope, statement: Statement, timeout_ms: int
    ) -> tuple[list[str], list[list[Any]]]:
        """Column names and rows of a read the server stops after `timeout_ms`."""
        try:
            return self._read(scope, statement, timeout_ms)
        except StoreError as exc:
            cause = str(exc.__cause__)
            if any(text in cause.lower() for text in _OVER_BUDGET):
                raise QueryBudgetExceeded(
                    f"FalkorDB stopped the query at its budget ({timeout_ms} ms, or the server's "
                    f"QUERY_MEM_CAPACITY): {cause}"
                ) from exc.__cause__
            if "TIMEOUT_MAX" in cause:
                raise StoreError(
                    f"the Cypher timeout ({timeout_ms} ms) is above the FalkorDB server's TIMEOUT_MAX: "
                    "lower KENNING_CYPHER_TIMEOUT_MS or raise TIMEOUT_MAX"
                ) from exc.__cause__
            if type(exc.__cause__) is redis.exceptions.ResponseError:
                # The server's own state has an error class of its own (OOM, LOADING, READONLY...):
                # a plain one is the query's (a syntax error, an unknown function or variable).
                raise InputError(f"the Cypher query is not valid: {cause}") from exc.__cause__
            raise

    def _read(
        self, scope: Scope, statement: Statement, timeout_ms: int | None
    ) -> tuple[list[str], list[list[Any]]]:
        try:
            with _translated():
                result = self._graph(scope).ro_query(statement.query, statement.params, timeout=timeout_ms)
                return [str(column[1]) for column in result.header], list(result.result_set)
        except StoreError as exc:
            # A graph that was never written to does not exist yet: it holds nothing.
            if "empty key" in str(exc.__cause__):
                return [], []
            raise

    def write(self, scope: Scope, statement: Statement) -> list[list[Any]]:
        with _translated():
            return list(self._graph(scope).query(statement.query, statement.params).result_set)

    def create_index(self, scope: Scope, query: str) -> None:
        try:
            with _translated():
                self._graph(scope).query(query)
        except StoreError as exc:
            if "already indexed" not in str(exc.__cause__):
                raise

    def drop_telemetry(self, scope: Scope) -> int:
        self._graph(scope)  # connected, telemetry turned off first
        with _translated():
            dropped: int = redis.Redis(connection_pool=self._pool).delete(telemetry_key(self.database(scope)))
        return dropped

    def close(self) -> None:
        with _translated():
            self._pool.disconnect()

    def _telemetry_off(self) -> None:
        try:
            with _translated():
                client = redis.Redis(connection_pool=self._pool)
                client.execute_command("GRAPH.CONFIG", "SET", "MAX_INFO_QUERIES", "0")  # type: ignore[no-untyped-call]
        except StoreError as exc:
            if not isinstance(exc.__cause__, redis.exceptions.ResponseError):
                raise
            # A server that refuses it (an ACL) keeps telemetry: forget still drops the scope's stream.
            log.warning("FalkorDB keeps query telemetry (start it with CMD_INFO no): %s", exc)

    def _graph(self, scope: Scope) -> Any:
        key = graph_key(self._graph_name, scope)
        with self._lock:
            # The client talks to the server as soon as it is built, so it is built on first use.
            if self._client is None:
                if not self._query_telemetry:
                    self._telemetry_off()
                self._client = FalkorDB(connection_pool=self._pool)
            if key not in self._graphs:
                self._graphs[key] = self._client.select_graph(key)
            return self._graphs[key]


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
