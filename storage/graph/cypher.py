"""The Cypher core shared by the FalkorDB and Memgraph graph stores.

Statements are (query, params) pairs. Every value travels as a parameter; the only
text put into a query is a label or relationship type, reduced to `[A-Za-z0-9_]`
and backticked. Every node carries the label `Node` plus one for its type, and
`tenant`, `dataset` and `id` properties: MERGE and every read match all three,
so the same id in two scopes names two nodes. Edges carry their relationship as
their type (sanitized) and verbatim as a `relationship` property, their id as `id`.

Property values a Cypher store cannot hold exactly (maps, nulls, nested lists,
integers beyond 64 bits, floats that FalkorDB would round, strings with NUL) and
keys it cannot take (empty, backticked, or named like a structural field) travel
together as one JSON string in `extra_json`, so every property round-trips.

An edge id is expected to name one (source, relationship, target), as the
deterministic ids of `kenning.pipeline.models.Edge` do: re-upserting an id with other
endpoints or another relationship adds an edge rather than moving the old one.

Every runner call names its scope, and the runner picks the database that holds it:
FalkorDB gives each scope a graph of its own, Memgraph keeps every scope in one database.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import EdgeShape, GraphEdge, GraphNode, Removal, Scope
from kenning.pipeline.ports import Neighbourhood
from kenning.storage.graph.rules import (
    by_first_end,
    edge_shape,
    expand,
    over_stored_edges,
    over_stored_nodes,
    removal,
    take_support,
    union,
    unique_edges,
    unique_nodes,
)

BATCH_SIZE = 1000
NODE_LABEL = "Node"
EXTRA = "extra_json"
NODE_FIELDS = frozenset({"id", "tenant", "dataset", "type", "data_ids", EXTRA})
EDGE_FIELDS = frozenset({"id", "tenant", "dataset", "relationship", "data_ids", EXTRA})
# The id index comes first: every MERGE and MATCH below starts from :Node(id).
INDEXES = ("CREATE INDEX ON :Node(id)", "CREATE INDEX ON :Node(dataset)")
MAX_NAME = 64
INT64 = 2**63

_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_SCOPED_NODE = "{id: %s, tenant: $tenant, dataset: $dataset}"
# reduce() rather than a list comprehension: Memgraph has had comprehensions only since 2025.
_UNION_IDS = "reduce(acc = old_ids, x IN row.data_ids | CASE WHEN x IN acc THEN acc ELSE acc + [x] END)"

# FalkorDB drops the SETs of rows that a later WITH ... WHERE filters out, so this
# returns every row and the caller picks the retyped nodes.
_UPSERT_NODES = (
    "UNWIND $rows AS row "
    "MERGE (n:Node " + _SCOPED_NODE % "row.id" + ") "
    "WITH n, row, coalesce(n.data_ids, []) AS old_ids, n.type AS old_type "
    "SET n = row.props, n.data_ids = " + _UNION_IDS + " "
    "SET n:`{label}` "
    "RETURN n.id, old_type"
)
_REMOVE_LABEL = "UNWIND $ids AS id MATCH (n:Node " + _SCOPED_NODE % "id" + ") REMOVE n:`{label}`"
_UPSERT_EDGES = (
    "UNWIND $rows AS row "
    "MATCH (a:Node " + _SCOPED_NODE % "row.source_id" + ") "
    "MATCH (b:Node " + _SCOPED_NODE % "row.target_id" + ") "
    "MERGE (a)-[r:`{label}` {id: row.id}]->(b) "
    "WITH r, row, coalesce(r.data_ids, []) AS old_ids "
    "SET r = row.props, r.data_ids = " + _UNION_IDS
)
_GET_NODES = "UNWIND $ids AS id MATCH (n:Node " + _SCOPED_NODE % "id" + ") RETURN properties(n)"
_EDGE_IN_SCOPE = "WHERE r.tenant = $tenant AND r.dataset = $dataset "
_EDGE_COLUMNS = "RETURN a.id AS source_id, b.id AS target_id, properties(r) AS props"
_EDGES_FROM = "UNWIND $ids AS id MATCH (a:Node " + _SCOPED_NODE % "id" + ")-[r]->(b:Node) "
_EDGES_TO = "UNWIND $ids AS id MATCH (a:Node)-[r]->(b:Node " + _SCOPED_NODE % "id" + ") "
_GET_EDGES = f"{_EDGES_FROM}{_EDGE_IN_SCOPE}{_EDGE_COLUMNS} UNION {_EDGES_TO}{_EDGE_IN_SCOPE}{_EDGE_COLUMNS}"
_EDGES_AMONG = f"{_EDGES_FROM}{_EDGE_IN_SCOPE}AND b.id IN $all {_EDGE_COLUMNS}"
_FOLLOWED = "AND NOT r.relationship IN $skip "
_EDGES_FOLLOWED = (
    f"{_EDGES_FROM}{_EDGE_IN_SCOPE}{_FOLLOWED}{_EDGE_COLUMNS} UNION "
    f"{_EDGES_TO}{_EDGE_IN_SCOPE}{_FOLLOWED}{_EDGE_COLUMNS}"
)
_EDGE_SHAPE = "RETURN r.id, a.id, b.id, coalesce(r.relationship, '')"
_SHAPES_FOLLOWED = (
    f"{_EDGES_FROM}{_EDGE_IN_SCOPE}{_FOLLOWED}{_EDGE_SHAPE} UNION "
    f"{_EDGES_TO}{_EDGE_IN_SCOPE}{_FOLLOWED}{_EDGE_SHAPE}"
)
_DEGREES = (
    "UNWIND $ids AS id MATCH (n:Node "
    + _SCOPED_NODE % "id"
    + ")-[r]-(:Node) "
    + _EDGE_IN_SCOPE
    + _FOLLOWED
    + "RETURN id, count(DISTINCT r.id)"
)
_SCOPE_NODES = "MATCH (n:Node {tenant: $tenant, dataset: $dataset}) "
_SCOPE_EDGES = "MATCH (a:Node {tenant: $tenant, dataset: $dataset})-[r]->(b:Node) " + _EDGE_IN_SCOPE
_EXPORT_NODES = _SCOPE_NODES + "RETURN properties(n)"
_EXPORT_EDGES = _SCOPE_EDGES + _EDGE_COLUMNS
_COUNT_NODES = _SCOPE_NODES + "RETURN count(n)"
_COUNT_EDGES = _SCOPE_EDGES + "RETURN count(r)"
_DELETE_SCOPE = _SCOPE_NODES + "DETACH DELETE n"
_SUPPORTED = "any(x IN {0}.data_ids WHERE x IN $ids) "
_TOUCHED_NODES = _SCOPE_NODES + "WHERE " + _SUPPORTED.format("n") + "RETURN n.id, n.data_ids"
_TOUCHED_EDGES = _SCOPE_EDGES + "AND " + _SUPPORTED.format("r") + "RETURN r.id, r.data_ids"
_EDGES_TOUCHING = (
    "UNWIND $ids AS id MATCH (n:Node "
    + _SCOPED_NODE % "id"
    + ")-[r]-(:Node) "
    + _EDGE_IN_SCOPE
    + "RETURN DISTINCT r.id"
)
_SET_NODE_DATA = (
    "UNWIND $rows AS row MATCH (n:Node " + _SCOPED_NODE % "row.id" + ") SET n.data_ids = row.data_ids"
)
_SET_EDGE_DATA = "UNWIND $rows AS row " + _SCOPE_EDGES + "AND r.id = row.id SET r.data_ids = row.data_ids"
_DELETE_EDGES = "UNWIND $ids AS id " + _SCOPE_EDGES + "AND r.id = id DELETE r"
_DELETE_NODES = "UNWIND $ids AS id MATCH (n:Node " + _SCOPED_NODE % "id" + ") DETACH DELETE n"


class Statement(NamedTuple):
    query: str
    params: dict[str, Any]


class CypherRunner(Protocol):
    """Runs statements on the database that holds a scope; driver errors leave it as StoreError."""

    def read(self, scope: Scope, statement: Statement) -> list[list[Any]]: ...
    def write(self, scope: Scope, statement: Statement) -> list[list[Any]]: ...
    def database(self, scope: Scope) -> str:
        """The name of the database (or graph) that holds the scope."""
        ...

    def create_index(self, scope: Scope, query: str) -> None:
        """Create the index in the scope's database; one that already exists is not an error."""
        ...

    def close(self) -> None: ...


def label_of(name: str) -> str:
    """A label or relationship type for `name` made of `[A-Za-z0-9_]` only."""
    return _UNSAFE.sub("_", name)[:MAX_NAME] or "_"


def upsert_node_statements(
    scope: Scope, nodes: Sequence[GraphNode], batch_size: int = BATCH_SIZE
) -> list[tuple[Statement, str]]:
    """One statement per batch of nodes sharing a label, with that label."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for node in unique_nodes(nodes):
        by_label.setdefault(label_of(node.type), []).append(_node_row(scope, node))
    return [
        (Statement(_labelled(_UPSERT_NODES, label), _scoped(scope, rows=batch)), label)
        for label, rows in by_label.items()
        for batch in _batches(rows, batch_size)
    ]


def stale_labels(rows: list[list[Any]], label: str) -> dict[str, list[str]]:
    """Node ids per label they kept from an earlier type, from an upsert's (id, old type) rows."""
    stale: dict[str, list[str]] = {}
    for node_id, old_type in rows:
        if old_type is None:
            continue
        old_label = label_of(str(old_type))
        if old_label not in (label, NODE_LABEL):
            stale.setdefault(old_label, []).append(node_id)
    return stale


def remove_label_statement(scope: Scope, node_ids: list[str], label: str) -> Statement:
    return Statement(_labelled(_REMOVE_LABEL, label_of(label)), _scoped(scope, ids=node_ids))


def upsert_edge_statements(
    scope: Scope, edges: Sequence[GraphEdge], batch_size: int = BATCH_SIZE
) -> list[Statement]:
    """One statement per batch of edges sharing a relationship type; run them after the nodes."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for edge in unique_edges(edges):
        by_label.setdefault(label_of(edge.relationship), []).append(_edge_row(scope, edge))
    return [
        Statement(_labelled(_UPSERT_EDGES, label), _scoped(scope, rows=batch))
        for label, rows in by_label.items()
        for batch in _batches(rows, batch_size)
    ]


def get_node_statements(
    scope: Scope, node_ids: Sequence[str], batch_size: int = BATCH_SIZE
) -> list[Statement]:
    """Statements returning one row per found node: its property map."""
    unique = list(dict.fromkeys(node_ids))
    return [Statement(_GET_NODES, _scoped(scope, ids=batch)) for batch in _batches(unique, batch_size)]


def get_edge_statements(
    scope: Scope, node_ids: Sequence[str], batch_size: int = BATCH_SIZE, among: bool = False
) -> list[Statement]:
    """Statements returning (source id, target id, property map) of edges touching the ids
    (with both endpoints among them, when `among`)."""
    unique = list(dict.fromkeys(node_ids))
    if among:
        return [
            Statement(_EDGES_AMONG, _scoped(scope, ids=batch, all=unique))
            for batch in _batches(unique, batch_size)
        ]
    return [Statement(_GET_EDGES, _scoped(scope, ids=batch)) for batch in _batches(unique, batch_size)]


def export_statements(scope: Scope) -> tuple[Statement, Statement]:
    return Statement(_EXPORT_NODES, _scoped(scope)), Statement(_EXPORT_EDGES, _scoped(scope))


def count_statements(scope: Scope) -> tuple[Statement, Statement]:
    return Statement(_COUNT_NODES, _scoped(scope)), Statement(_COUNT_EDGES, _scoped(scope))


def delete_scope_statement(scope: Scope) -> Statement:
    return Statement(_DELETE_SCOPE, _scoped(scope))


def node_from_row(row: list[Any], provenance: bool = True) -> GraphNode:
    stored: dict[str, Any] = row[0]
    return GraphNode(
        id=stored["id"],
        type=stored.get("type", ""),
        properties=decode_properties(stored, NODE_FIELDS),
        data_ids=union(stored.get("data_ids") or ()) if provenance else [],
    )


def edge_from_row(row: list[Any], provenance: bool = True) -> GraphEdge:
    source_id, target_id, stored = row
    return GraphEdge(
        id=stored["id"],
        source_id=source_id,
        target_id=target_id,
        relationship=stored.get("relationship", ""),
        properties=decode_properties(stored, EDGE_FIELDS),
        data_ids=union(stored.get("data_ids") or ()) if provenance else [],
    )


def encode_properties(properties: dict[str, Any], reserved: frozenset[str]) -> dict[str, Any]:
    """Properties as a Cypher store holds them: plain values by name, the rest in `extra_json`."""
    plain: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in properties.items():
        if _is_plain_key(key, reserved) and _is_plain(value):
            plain[key] = value
        else:
            extra[key] = value
    if extra:
        try:
            plain[EXTRA] = json.dumps(extra, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise StoreError(f"graph properties must be JSON-serializable: {exc}") from exc
    return plain


def decode_properties(stored: dict[str, Any], reserved: frozenset[str]) -> dict[str, Any]:
    properties = {key: value for key, value in stored.items() if key not in reserved}
    extra = stored.get(EXTRA)
    if isinstance(extra, str):
        properties.update(json.loads(extra))
    return properties


class CypherGraphStore:
    """A GraphStore over one Cypher database; the runner speaks the database's protocol.

    Each batch is one transaction: a failed call may leave earlier batches written,
    which a retry of the same call completes, as upserts are idempotent.
    """

    def __init__(self, runner: CypherRunner, batch_size: int = BATCH_SIZE) -> None:
        self._runner = runner
        self._batch_size = batch_size
        self._indexed: set[str] = set()

    def upsert_nodes(self, scope: Scope, nodes: Sequence[GraphNode]) -> None:
        unique = unique_nodes(nodes)
        unique = over_stored_nodes(unique, self.get_nodes(scope, [node.id for node in unique]))
        statements = upsert_node_statements(scope, unique, self._batch_size)
        self._ensure_indexes(scope)
        for statement, label in statements:
            rows = self._runner.write(scope, statement)
            for old_label, node_ids in stale_labels(rows, label).items():
                self._runner.write(scope, remove_label_statement(scope, node_ids, old_label))

    def upsert_edges(self, scope: Scope, edges: Sequence[GraphEdge]) -> None:
        unique = unique_edges(edges)
        ends = {node_id for edge in unique for node_id in (edge.source_id, edge.target_id)}
        unique = over_stored_edges(unique, self.get_edges(scope, sorted(ends), among=True))
        statements = upsert_edge_statements(scope, unique, self._batch_size)
        self._ensure_indexes(scope)
        for statement in statements:
            self._runner.write(scope, statement)

    def get_nodes(self, scope: Scope, node_ids: Sequence[str], *, provenance: bool = True) -> list[GraphNode]:
        statements = get_node_statements(scope, node_ids, self._batch_size)
        rows = (row for statement in statements for row in self._runner.read(scope, statement))
        return [node_from_row(row, provenance) for row in rows]

    def get_edges(
        self, scope: Scope, node_ids: Sequence[str], among: bool = False, *, provenance: bool = True
    ) -> list[GraphEdge]:
        found: dict[str, GraphEdge] = {}
        for statement in get_edge_statements(scope, node_ids, self._batch_size, among):
            for row in self._runner.read(scope, statement):
                edge = edge_from_row(row, provenance)
                found[edge.id] = edge
        return list(found.values())

    def edge_shapes(self, scope: Scope, node_ids: Sequence[str]) -> list[EdgeShape]:
        return [edge_shape(edge) for edge in self.get_edges(scope, node_ids, provenance=False)]

    def neighbourhood(
        self,
        scope: Scope,
        node_ids: Sequence[str],
        hops: int = 1,
        limit: int = 1000,
        max_degree: int = 200,
        skip: Sequence[str] = (),
        shape_only: bool = False,
    ) -> Neighbourhood:
        skipped = sorted(set(skip))

        def degrees(ids: list[str]) -> dict[str, int]:
            counts: dict[str, int] = {}
            for batch in _batches(ids, self._batch_size):
                statement = Statement(_DEGREES, _scoped(scope, ids=batch, skip=skipped))
                counts.update((str(row[0]), int(row[1])) for row in self._runner.read(scope, statement))
            return counts

        def touching(ids: list[str]) -> list[GraphEdge]:
            found: dict[str, GraphEdge] = {}
            for batch in _batches(ids, self._batch_size):
                statement = Statement(_EDGES_FOLLOWED, _scoped(scope, ids=batch, skip=skipped))
                rows = self._runner.read(scope, statement)
                found.update((edge.id, edge) for edge in map(edge_from_row, rows))
            return list(found.values())

        def shapes(ids: list[str]) -> list[EdgeShape]:
            found: dict[str, EdgeShape] = {}
            for batch in _batches(ids, self._batch_size):
                statement = Statement(_SHAPES_FOLLOWED, _scoped(scope, ids=batch, skip=skipped))
                for row in self._runner.read(scope, statement):
                    found[str(row[0])] = EdgeShape(str(row[0]), str(row[1]), str(row[2]), str(row[3]))
            return list(found.values())

        if shape_only:
            return expand(degrees, by_first_end(shapes), node_ids, hops, limit, max_degree)
        return expand(degrees, by_first_end(touching), node_ids, hops, limit, max_degree)

    def export(self, scope: Scope) -> tuple[list[GraphNode], list[GraphEdge]]:
        nodes_statement, edges_statement = export_statements(scope)
        nodes = [node_from_row(row) for row in self._runner.read(scope, nodes_statement)]
        edges = [edge_from_row(row) for row in self._runner.read(scope, edges_statement)]
        return nodes, edges

    def counts(self, scope: Scope) -> tuple[int, int]:
        nodes_statement, edges_statement = count_statements(scope)
        nodes, edges = (_count(self._runner.read(scope, s)) for s in (nodes_statement, edges_statement))
        return nodes, edges

    def remove_data(self, scope: Scope, data_ids: Sequence[str]) -> Removal:
        gone = sorted(set(data_ids))
        touched = (Statement(query, _scoped(scope, ids=gone)) for query in (_TOUCHED_NODES, _TOUCHED_EDGES))
        nodes, edges = (take_support(self._id_lists(scope, statement), set(gone)) for statement in touched)
        dangling = [
            str(row[0])
            for batch in _batches(nodes[0], self._batch_size)
            for row in self._runner.read(scope, Statement(_EDGES_TOUCHING, _scoped(scope, ids=batch)))
        ]
        result = removal(nodes, edges, dangling)
        for template, ids in ((_DELETE_EDGES, result.deleted_edges), (_DELETE_NODES, result.deleted_nodes)):
            for batch in _batches(ids, self._batch_size):
                self._runner.write(scope, Statement(template, _scoped(scope, ids=batch)))
        kept_edges = {key: value for key, value in result.kept.items() if key in edges[1]}
        for template, kept in ((_SET_NODE_DATA, nodes[1]), (_SET_EDGE_DATA, kept_edges)):
            rows = [{"id": key, "data_ids": value} for key, value in kept.items()]
            for batch in _batches(rows, self._batch_size):
                self._runner.write(scope, Statement(template, _scoped(scope, rows=batch)))
        return result

    def supported_by(self, scope: Scope, data_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        wanted = sorted(set(data_ids))
        nodes = self._id_lists(scope, Statement(_TOUCHED_NODES, _scoped(scope, ids=wanted)))
        edges = self._id_lists(scope, Statement(_TOUCHED_EDGES, _scoped(scope, ids=wanted)))
        return sorted(nodes), sorted(edges)

    def delete_elements(self, scope: Scope, node_ids: Sequence[str], edge_ids: Sequence[str]) -> None:
        # Edges first: DETACH DELETE then takes the nodes' remaining edges with them.
        for template, ids in ((_DELETE_EDGES, list(edge_ids)), (_DELETE_NODES, list(node_ids))):
            for batch in _batches(ids, self._batch_size):
                self._runner.write(scope, Statement(template, _scoped(scope, ids=batch)))

    def _id_lists(self, scope: Scope, statement: Statement) -> dict[str, list[str]]:
        return {str(row[0]): [str(x) for x in row[1] or []] for row in self._runner.read(scope, statement)}

    def close(self) -> None:
        self._runner.close()

    def _delete_scope(self, scope: Scope) -> None:
        """Remove a scope's nodes and edges; for test cleanup, not part of the port."""
        self._runner.write(scope, delete_scope_statement(scope))

    def _ensure_indexes(self, scope: Scope) -> None:
        # Once per database and process; a race only repeats a harmless CREATE INDEX.
        database = self._runner.database(scope)
        if database in self._indexed:
            return
        for query in INDEXES:
            self._runner.create_index(scope, query)
        self._indexed.add(database)


def _labelled(template: str, label: str) -> str:
    return template.replace("{label}", label)


def _scoped(scope: Scope, **params: Any) -> dict[str, Any]:
    return {"tenant": scope.tenant, "dataset": scope.dataset, **params}


def _batches(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _count(rows: list[list[Any]]) -> int:
    return int(rows[0][0]) if rows else 0


def _node_row(scope: Scope, node: GraphNode) -> dict[str, Any]:
    props = encode_properties(node.properties, NODE_FIELDS)
    props.update(id=node.id, tenant=scope.tenant, dataset=scope.dataset, type=node.type)
    return {"id": node.id, "data_ids": node.data_ids, "props": props}


def _edge_row(scope: Scope, edge: GraphEdge) -> dict[str, Any]:
    props = encode_properties(edge.properties, EDGE_FIELDS)
    props.update(id=edge.id, tenant=scope.tenant, dataset=scope.dataset, relationship=edge.relationship)
    return {
        "id": edge.id,
        "source_id": edge.source_id,
        "target_id": edge.target_id,
        "data_ids": edge.data_ids,
        "props": props,
    }


def _is_plain_key(key: str, reserved: frozenset[str]) -> bool:
    return bool(key) and key not in reserved and "`" not in key and "\x00" not in key


def _is_plain(value: Any) -> bool:
    if type(value) is list:
        return all(_is_plain_scalar(item) for item in value)
    return _is_plain_scalar(value)


def _is_plain_scalar(value: Any) -> bool:
    kind = type(value)
    if kind is str:
        return "\x00" not in value
    if kind is bool:
        return True
    if kind is int:
        return bool(-INT64 <= value < INT64)
    if kind is float:
        # FalkorDB answers doubles with 15 significant digits; others would come back changed.
        return math.isfinite(value) and float(f"{value:.15g}") == value
    return False


def plain_value(value: Any) -> Any:
    """Driver values as JSON-ready ones: nodes and relationships become property dicts."""
    if isinstance(value, list | tuple):
        return [plain_value(item) for item in value]
    if isinstance(value, dict):
        return {str(key): plain_value(item) for key, item in value.items()}
    properties = getattr(value, "properties", None)
    if isinstance(properties, dict):
        return {str(key): plain_value(item) for key, item in properties.items()}
    if hasattr(value, "items") and hasattr(value, "keys"):
        return {str(key): plain_value(item) for key, item in value.items()}
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)
