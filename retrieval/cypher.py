"""CYPHER runs a caller's read-only query; NATURAL_LANGUAGE has the LLM write one from the schema.

Both are refused unless the settings enable them and the caller is allowed (the
dispatcher's caller sets `options["cypher_allowed"]`). Queries are checked before they
run: one statement, no clause that writes, no procedure calls; the graph store then runs
them on its read-only path. `$tenant` and `$dataset` are bound to the searched dataset.
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol, runtime_checkable

from kenning.pipeline.errors import KenningError
from kenning.pipeline.models import Scope
from kenning.retrieval.contract import Hit, SearchPorts, SearchRequest, answer_from_context

MAX_ROWS = 200
MAX_ATTEMPTS = 3
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
        self, scope: Scope, query: str, params: dict[str, Any] | None = None
    ) -> list[list[Any]]: ...


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
    return query.strip().rstrip(";")


class CypherRetriever:
    def __init__(self, ports: SearchPorts) -> None:
        self._ports = ports

    def reader(self, request: SearchRequest) -> CypherReader:
        if not request.options.get("cypher_allowed"):
            raise QueryRejected(
                "Cypher queries are disabled: set KENNING_CYPHER_ENABLED and allow the caller"
            )
        graph = self._ports.graph
        if not isinstance(graph, CypherReader):
            raise QueryRejected(
                "Cypher needs a Cypher graph backend (KENNING_GRAPH_BACKEND=memgraph or falkordb)"
            )
        return graph

    def run(self, request: SearchRequest, query: str) -> list[Hit]:
        reader, checked = self.reader(request), check_read_only(query)
        hits: list[Hit] = []
        for scope in request.scopes:
            for row in reader.read_query(scope, checked)[:MAX_ROWS]:
                text = json.dumps(row, ensure_ascii=False, default=str)
                hits.append(
                    Hit(text=text, score=0.0, kind="row", dataset=scope.dataset, extra={"query": checked})
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
        reader = self.reader(request)
        schema = describe_schema(reader, request.scopes[0])
        prompt = f"Schema:\n{schema}\n\nQuestion: {request.query}"
        error = ""
        for _ in range(MAX_ATTEMPTS):
            query = _strip_fences(self._ports.completer.complete(_NL_SYSTEM, prompt + error))
            try:
                return self.run(request, query)
            except KenningError as failure:
                error = f"\n\nYour previous query:\n{query}\nfailed with: {failure}\nWrite a corrected query."
        raise QueryRejected(f"no valid read-only query after {MAX_ATTEMPTS} attempts{error}")


def describe_schema(reader: CypherReader, scope: Scope) -> str:
    """Node types, relationship types and property names of one dataset's graph."""
    types = reader.read_query(
        scope, "MATCH (n:Node {tenant: $tenant, dataset: $dataset}) RETURN DISTINCT n.type"
    )
    relations = reader.read_query(
        scope,
        "MATCH (a:Node {tenant: $tenant, dataset: $dataset})-[r]->(b:Node) RETURN DISTINCT type(r) LIMIT 200",
    )
    node_types = ", ".join(sorted(str(row[0]) for row in types if row and row[0]))
    edge_types = ", ".join(sorted(str(row[0]) for row in relations if row and row[0]))
    return f"Node types: {node_types}\nRelationship types: {edge_types}"


def _strip_fences(text: str) -> str:
    return re.sub(r"^```(?:cypher)?|```$", "", text.strip(), flags=re.IGNORECASE | re.MULTILINE).strip()
