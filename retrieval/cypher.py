"""CYPHER runs a caller's read-only query; NATURAL_LANGUAGE has the LLM write one from the schema.

Both are refused unless the request's principal `may_run_cypher`, and run only on the
scopes it may read. They need a graph store whose `read_query` runs on one scope's data
alone (FalkorDB: a graph per dataset); stores that keep datasets side by side (SQL,
Memgraph) offer none, as nothing there could keep a query to the caller's datasets.
Queries are checked before they run: one statement, no clause that writes, no procedure
calls, balanced braces; the store then runs them on its read-only path within the
principal's `cypher_budget`. `$tenant` and `$dataset` are bound to the searched dataset.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol, runtime_checkable

from kenning.pipeline.errors import KenningError
from kenning.pipeline.models import Scope
from kenning.retrieval.contract import Hit, QueryBudget, SearchPorts, SearchRequest, answer_from_context

MAX_ATTEMPTS = 3
# FalkorDB builds a range() whole before it checks the query's timeout or memory cap (about
# 4 s per hundred million values here), so its size is checked before the query runs.
MAX_RANGE_VALUES = 5_000_000
_RANGE = re.compile(r"\brange\s*\(", re.IGNORECASE)
_INTEGER = re.compile(r"^\s*[+-]?\d+\s*$")
_WRITES = re.compile(
    r"\b(CREATE|MERGE|SET|DELETE|DETACH|REMOVE|DROP|LOAD|FOREACH|CALL|GRANT|DENY|REVOKE|ALTER)\b",
    re.IGNORECASE,
)
# Strings and comments, scanned left to right so that neither hides inside the other.
_LITERALS = re.compile(r"('(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"|`[^`]*`)|//[^\n]*|/\*.*?\*/", re.DOTALL)
_NL_SYSTEM = (
    "Write ONE read-only Cypher query (MATCH ... RETURN ..., LIMIT 50) answering the question over "
    "the graph schema given. Every node has the label Node, a label for its type, and properties "
    "tenant, dataset, id, name or text. Filter nodes with {tenant: $tenant, dataset: $dataset}. "
    "Reply with the query only, no explanation, no code fences."
)


class QueryRejected(KenningError):
    """A Cypher query was refused: not allowed here, or not read-only."""


@runtime_checkable
class CypherReader(Protocol):
    def read_query(
        self,
        scope: Scope,
        query: str,
        params: dict[str, Any] | None = None,
        *,
        timeout_ms: int,
        max_rows: int,
    ) -> list[dict[str, Any]]:
        """Rows (by column name) of a read-only query that sees the scope's data alone,
        stopped by the server past `timeout_ms` and cut at `max_rows`."""
        ...


def check_read_only(query: str) -> str:
    """The query, stripped, if it is one read-only statement; otherwise QueryRejected."""
    bare = _LITERALS.sub(lambda m: "''" if m.group(1) else " ", query).strip().rstrip(";").strip()
    if not bare:
        raise QueryRejected("the Cypher query is empty")
    if ";" in bare:
        raise QueryRejected("only one Cypher statement may run at a time")
    written = _WRITES.search(bare)
    if written:
        raise QueryRejected(f"read-only queries only: {written.group(1).upper()} is not allowed")
    if not _balanced(bare):
        # The store nests the query in `CALL { ... } RETURN * LIMIT n`: a stray `}` would end it early.
        raise QueryRejected("the Cypher query has unbalanced braces")
    _check_ranges(bare)
    return query.strip().rstrip(";")


def _check_ranges(bare: str) -> None:
    """QueryRejected for a range() whose size is not known from its text, or over MAX_RANGE_VALUES."""
    for match in _RANGE.finditer(bare):
        args = _arguments(bare, match.end())
        if len(args) not in (2, 3) or not all(_INTEGER.match(arg) for arg in args):
            raise QueryRejected(
                "range() takes integer literals here (start, end and an optional step), so that "
                "its size is known before the query runs"
            )
        start, end, step = (int(arg) for arg in (*args, "1")[:3])
        if step == 0:
            raise QueryRejected("range() needs a step other than 0")
        count = max(0, (end - start) // step + 1)
        if count > MAX_RANGE_VALUES:
            raise QueryRejected(
                f"range() of {count} values is over the limit of {MAX_RANGE_VALUES}: the graph "
                "server builds a range whole before it checks the query's budget"
            )


def _arguments(text: str, start: int) -> list[str]:
    """The top-level, comma-separated arguments of the call whose `(` ends just before `start`;
    [] when the call does not end."""
    args: list[str] = []
    depth, begin = 0, start
    for index in range(start, len(text)):
        char = text[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return [*args, text[begin:index]]
            depth -= 1
        elif char == "," and depth == 0:
            args.append(text[begin:index])
            begin = index + 1
    return []


class CypherRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def reader(self, request: SearchRequest) -> CypherReader:
        if not request.principal.may_run_cypher:
            raise QueryRejected(
                "Cypher queries are disabled: set KENNING_CYPHER_ENABLED and allow the caller"
            )
        graph = self._ports.graph
        if not isinstance(graph, CypherReader):
            raise QueryRejected(
                "Cypher needs KENNING_GRAPH_BACKEND=falkordb, which keeps each dataset in a graph of "
                "its own: the sql and memgraph backends keep datasets side by side, and nothing "
                "there could keep a query to the caller's datasets"
            )
        return graph

    def run(self, request: SearchRequest, query: str) -> list[Hit]:
        reader, checked = self.reader(request), check_read_only(query)
        hits: list[Hit] = []
        for scope in readable(request):
            for row in read(reader, scope, checked, request.principal.cypher_budget):
                text = json.dumps(row, ensure_ascii=False, default=str)
                hits.append(
                    Hit(text=text, score=1.0, kind="row", dataset=scope.dataset, extra={"query": checked})
                )
        return hits[: request.top_k] if request.options.get("limit_rows") else hits

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        return self.run(request, request.query)

    def get_context_from_objects(self, request: SearchRequest, objects: list[Hit]) -> str:
        return "\n".join(hit.text for hit in objects)

    def get_completion_from_context(self, request: SearchRequest, context: str) -> str:
        return answer_from_context(self._ports.completer, request.query, context)


class NaturalLanguageRetriever(CypherRetriever):
    """The LLM writes the query from the schema; a failing query is sent back with its error."""

    def get_retrieved_objects(self, request: SearchRequest) -> list[Hit]:
        reader, scopes = self.reader(request), readable(request)
        if not scopes:
            return []
        schema = describe_schema(reader, scopes[0], request.principal.cypher_budget)
        prompt = f"Schema:\n{schema}\n\nQuestion: {request.query}"
        error = ""
        for _ in range(MAX_ATTEMPTS):
            query = _strip_fences(self._ports.completer.complete(_NL_SYSTEM, prompt + error))
            try:
                return self.run(request, query)
            except KenningError as failure:
                error = f"\n\nYour previous query:\n{query}\nfailed with: {failure}\nWrite a corrected query."
        raise QueryRejected(f"no valid read-only query after {MAX_ATTEMPTS} attempts{error}")


def describe_schema(reader: CypherReader, scope: Scope, budget: QueryBudget) -> str:
    """Node types, relationship types and property names of one dataset's graph."""
    types = read(reader, scope, "MATCH (n:Node) RETURN DISTINCT n.type AS name", budget)
    relations = read(reader, scope, "MATCH (:Node)-[r]->(:Node) RETURN DISTINCT type(r) AS name", budget)
    node_types = ", ".join(sorted(str(row["name"]) for row in types if row.get("name")))
    edge_types = ", ".join(sorted(str(row["name"]) for row in relations if row.get("name")))
    return f"Node types: {node_types}\nRelationship types: {edge_types}"


def readable(request: SearchRequest) -> list[Scope]:
    """The request's scopes its principal may read; the others give nothing."""
    return [scope for scope in request.scopes if request.principal.may_read(scope)]


def read(reader: CypherReader, scope: Scope, query: str, budget: QueryBudget) -> list[dict[str, Any]]:
    return reader.read_query(scope, query, timeout_ms=budget.timeout_ms, max_rows=budget.max_rows)


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += 1 if char == "{" else -1 if char == "}" else 0
        if depth < 0:
            return False
    return depth == 0


def _strip_fences(text: str) -> str:
    return re.sub(r"^```(?:cypher)?|```$", "", text.strip(), flags=re.IGNORECASE | re.MULTILINE).strip()
