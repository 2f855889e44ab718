"""The graph as SQL tables on SQLite or PostgreSQL: the embedded default graph store."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import EdgeShape, GraphEdge, GraphNode, Removal, Scope
from kenning.pipeline.ports import Neighbourhood, chunked
from kenning.storage.graph.rules import (
    by_first_end,
    expand,
    over_stored_edges,
    over_stored_nodes,
    removal,
    take_support,
    unique_edges,
    unique_nodes,
)
from kenning.storage.graph.shape import MAX_EDGES, Shape
from kenning.storage.sql.engine import create_tables
from kenning.storage.sql.errors import translated_sql
from kenning.storage.sql.snapshots import Snapshots, bump, read_at_revision, revision_of, revisions_table

BATCH_SIZE = 500
NODE = "node"
EDGE = "edge"

metadata = sa.MetaData()

nodes_table = sa.Table(
    "graph_nodes",
    metadata,
    sa.Column("tenant", sa.String, primary_key=True),
    sa.Column("dataset", sa.String, primary_key=True),
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("type", sa.String, nullable=False),
    sa.Column("properties", sa.Text, nullable=False),
)

edges_table = sa.Table(
    "graph_edges",
    metadata,
    sa.Column("tenant", sa.String, primary_key=True),
    sa.Column("dataset", sa.String, primary_key=True),
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("source_id", sa.String, nullable=False),
    sa.Column("target_id", sa.String, nullable=False),
    sa.Column("relationship", sa.String, nullable=False),
    sa.Column("properties", sa.Text, nullable=False),
    sa.Index("ix_graph_edges_source", "tenant", "dataset", "source_id"),
    sa.Index("ix_graph_edges_target", "tenant", "dataset", "target_id"),
)

# What an edge's shape reads: its id, endpoints and relationship.
SHAPE_COLUMNS = tuple(edges_table.c[name] for name in ("id", "source_id", "target_id", "relationship"))

# One row per (node or edge, data item): upserts union provenance by inserting rows.
provenance_table = sa.Table(
    "graph_provenance",
    metadata,
    sa.Column("tenant", sa.String, primary_key=True),
    sa.Column("dataset", sa.String, primary_key=True),
    sa.Column("kind", sa.String(8), primary_key=True),
    sa.Column("item_id", sa.String, primary_key=True),
    sa.Column("data_id", sa.String, primary_key=True),
    # What a data item supports, for forget and records: without it each lookup scans the scope.
    sa.Index("ix_graph_provenance_data", "tenant", "dataset", "data_id"),
)

# Bumped by every write that adds, changes or removes edges: the shapes held in memory follow it.
revisions = revisions_table("graph_revisions", metadata)


def _prepared(table: sa.Table, *where: sa.ColumnElement[bool], columns: Sequence[Any] = ()) -> sa.Select[Any]:
    """A read of the table's rows (or `columns`) in one scope (`tenant`, `dataset` bound at
    execution), built once: a search runs dozens of these, and building the expression costs
    more than the query."""
    scoped = (table.c.tenant == sa.bindparam("tenant"), table.c.dataset == sa.bindparam("dataset"))
    return sa.select(*(columns or (table,))).where(*scoped, *where)


def _ids(name: str) -> sa.BindParameter[Any]:
    return sa.bindparam(name, expanding=True)


NODES_BY_ID = _prepared(nodes_table, nodes_table.c.id.in_(_ids("ids")))
EDGES_FROM = _prepared(edges_table, edges_table.c.source_id.in_(_ids("ids")))
EDGES_TO = _prepared(edges_table, edges_table.c.target_id.in_(_ids("ids")))
# Among: by the source index alone. An entity's incoming edges (a `contains` from every chunk
# that mentions it) far outnumber its outgoing ones, and SQLite, with no statistics, took the
# target index: 4,600 rows read for 70 edges on the full 2Wiki store. The target is compared as
# an expression (`|| ''`), which no index answers.
EDGES_AMONG = _prepared(
    edges_table,
    edges_table.c.source_id.in_(_ids("ids")),
    edges_table.c.target_id.op("||")(sa.literal_column("''")).in_(_ids("among")),
)
PROVENANCE_OF = _prepared(
    provenance_table,
    provenance_table.c.kind == sa.bindparam("kind"),
    provenance_table.c.item_id.in_(_ids("ids")),
    columns=(provenance_table.c.item_id, provenance_table.c.data_id),
)


class SqlGraphStore:
    """A GraphStore in `graph_*` tables, created on construction when missing.

    The walk's subgraph (`neighbourhood(shape_only=True)`) comes from the scope's edges held in
    memory (`graph_shape`) when they are current; `snapshots` is one of `kenning.storage.sql.snapshots.MODES`
    and `max_edges` bounds the edges held.
    """

    def __init__(self, engine: sa.Engine, snapshots: str = "background", max_edges: int = MAX_EDGES) -> None:
        if engine.dialect.name not in ("sqlite", "postgresql"):
            raise StoreError(f"the SQL graph store supports SQLite and PostgreSQL, not {engine.dialect.name}")
        self._engine = engine
        self._shapes: Snapshots[Shape] = Snapshots(max_edges, snapshots)
        with _translated():
            create_tables(engine, metadata)

    def upsert_nodes(self, scope: Scope, nodes: Sequence[GraphNode]) -> None:
        with _translated(), self._engine.begin() as conn:
            unique = unique_nodes(nodes)
            unique = over_stored_nodes(unique, _stored(conn, scope, nodes_table, [n.id for n in unique]))
            rows = [_node_row(scope, node) for node in unique]
            self._upsert(conn, nodes_table, rows, update=("type", "properties"))
            self._add_provenance(conn, _provenance_rows(scope, NODE, unique))

    def upsert_edges(self, scope: Scope, edges: Sequence[GraphEdge]) -> None:
        unique = unique_edges(edges)
        with _translated(), self._engine.begin() as conn:
            endpoints = {node_id for edge in unique for node_id in (edge.source_id, edge.target_id)}
            present = _existing_node_ids(conn, scope, endpoints)
            kept = [edge for edge in unique if edge.source_id in present and edge.target_id in present]
            kept = over_stored_edges(kept, _stored(conn, scope, edges_table, [e.id for e in kept]))
            rows = [_edge_row(scope, edge) for edge in kept]
            update = ("source_id", "target_id", "relationship", "properties")
            self._upsert(conn, edges_table, rows, update=update)
            self._add_provenance(conn, _provenance_rows(scope, EDGE, kept))
            bump(conn, revisions, scope)

    def get_nodes(self, scope: Scope, node_ids: Sequence[str], *, provenance: bool = True) -> list[GraphNode]:
        found: list[sa.Row[Any]] = []
        bound = _bound(scope)
        with _translated(), self._engine.connect() as conn:
            for batch in chunked(list(dict.fromkeys(node_ids)), BATCH_SIZE):
                found.extend(conn.execute(NODES_BY_ID, {**bound, "ids": batch}))
            data_ids = _provenance(conn, scope, NODE, [row.id for row in found]) if provenance else {}
        return [_node(row, data_ids) for row in found]

    def get_edges(
        self, scope: Scope, node_ids: Sequence[str], among: bool = False, *, provenance: bool = True
    ) -> list[GraphEdge]:
        found: dict[str, sa.Row[Any]] = {}
        unique = list(dict.fromkeys(node_ids))
        bound = _bound(scope)
        # Among: both ends in the nodes. Else one end: two reads, one per end's index (SQLite
        # answers `source IN (..) OR target IN (..)` by reading every edge of the scope).
        reads = [EDGES_AMONG] if among else [EDGES_FROM, EDGES_TO]
        with _translated(), self._engine.connect() as conn:
            for batch in chunked(unique, BATCH_SIZE):
                for read in reads:
                    rows = conn.execute(read, {**bound, "ids": batch, "among": unique})
                    found.update((row.id, row) for row in rows)
            data_ids = _provenance(conn, scope, EDGE, list(found)) if provenance else {}
        return [_edge(row, data_ids) for row in found.values()]

    def edge_shapes(self, scope: Scope, node_ids: Sequence[str]) -> list[EdgeShape]:
        """From the scope's shape when one is held and still current (a read of one row), else
        from the four columns; this never starts reading a shape."""
        unique = list(dict.fromkeys(node_ids))
        with _translated(), self._engine.connect() as conn:
            held = None
            if self._shapes.revision(scope) is not None:  # none held: no revision to read
                held = self._shapes.held(scope, revision_of(conn, revisions, scope))
            if held is not None:
                return held.touching_edges(unique)
            return _touching_shapes(conn, _in_scope(edges_table, scope), unique)

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
        with _translated(), self._engine.connect() as conn:
            held = self._shape(conn, scope) if shape_only else None
            if held is not None:
                return held.neighbourhood(node_ids, hops, limit, max_degree, frozenset(skip))
            table = edges_table
            followed = sa.and_(_in_scope(table, scope), table.c.relationship.not_in(list(skip)))

            def degrees(ids: list[str]) -> dict[str, int]:
                counts: dict[str, int] = {}
                for batch in chunked(ids, BATCH_SIZE):
                    # Each edge once per end among the batch, a loop once: no UNION to deduplicate.
                    ends = sa.union_all(
                        sa.select(table.c.source_id.label("node")).where(
                            followed, table.c.source_id.in_(batch)
                        ),
                        sa.select(table.c.target_id.label("node")).where(
                            followed, table.c.target_id.in_(batch), table.c.source_id != table.c.target_id
                        ),
                    ).subquery()
                    query = sa.select(ends.c.node, sa.func.count()).group_by(ends.c.node)
                    counts.update((str(node), int(count)) for node, count in conn.execute(query))
                return counts

            def touching(ids: list[str]) -> list[GraphEdge]:
                found: dict[str, sa.Row[Any]] = {}
                for batch in chunked(ids, BATCH_SIZE):
                    found.update((row.id, row) for row in _touching_rows(conn, followed, batch))
                data_ids = _provenance(conn, scope, EDGE, list(found))
                return [_edge(row, data_ids) for row in found.values()]

            if shape_only:
                shapes = functools.partial(_touching_shapes, conn, followed)
                return expand(degrees, by_first_end(shapes), node_ids, hops, limit, max_degree)
            return expand(degrees, by_first_end(touching), node_ids, hops, limit, max_degree)

    def shape_held(self, scope: Scope) -> int | None:
        """The revision at which the scope's edges are held in memory; None when they are not."""
        return self._shapes.revision(scope)

    def _shape(self, conn: sa.Connection, scope: Scope) -> Shape | None:
        return self._shapes.usable(
            scope, revision_of(conn, revisions, scope), lambda: self._read_shape(scope)
        )

    def _read_shape(self, scope: Scope) -> Shape | None:
        """The scope's edges as one shape; None if a write came in while they were read."""
        table = edges_table
        query = sa.select(*SHAPE_COLUMNS).where(_in_scope(table, scope))
        with _translated(), self._engine.connect() as conn:
            found = read_at_revision(
                conn, revisions, scope, lambda: [tuple(row) for row in conn.execute(query)]
            )
        return None if found is None else Shape.read(*found)

    def remove_data(self, scope: Scope, data_ids: Sequence[str]) -> Removal:
        gone = set(data_ids)
        with _translated(), self._engine.begin() as conn:
            touched = _touched(conn, scope, sorted(gone))
            nodes = take_support(_provenance(conn, scope, NODE, touched[NODE]), gone)
            edges = take_support(_provenance(conn, scope, EDGE, touched[EDGE]), gone)
            result = removal(nodes, edges, _edges_touching(conn, scope, nodes[0]))
            _delete_rows(conn, scope, provenance_table, provenance_table.c.data_id, sorted(gone))
            _delete_rows(conn, scope, nodes_table, nodes_table.c.id, result.deleted_nodes)
            _delete_rows(conn, scope, edges_table, edges_table.c.id, result.deleted_edges)
            _delete_rows(conn, scope, provenance_table, provenance_table.c.item_id, result.deleted)
            bump(conn, revisions, scope)
        return result

    def supported_by(self, scope: Scope, data_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        with _translated(), self._engine.connect() as conn:
            touched = _touched(conn, scope, sorted(set(data_ids)))
        return sorted(touched[NODE]), sorted(touched[EDGE])

    def delete_elements(self, scope: Scope, node_ids: Sequence[str], edge_ids: Sequence[str]) -> None:
        with _translated(), self._engine.begin() as conn:
            edges = list(dict.fromkeys([*edge_ids, *_edges_touching(conn, scope, list(node_ids))]))
            _delete_rows(conn, scope, nodes_table, nodes_table.c.id, list(node_ids))
            _delete_rows(conn, scope, edges_table, edges_table.c.id, edges)
            _delete_rows(conn, scope, provenance_table, provenance_table.c.item_id, [*node_ids, *edges])
            bump(conn, revisions, scope)

    def export(self, scope: Scope) -> tuple[list[GraphNode], list[GraphEdge]]:
        with _translated(), self._engine.connect() as conn:
            node_rows = conn.execute(sa.select(nodes_table).where(_in_scope(nodes_table, scope))).all()
            edge_rows = conn.execute(sa.select(edges_table).where(_in_scope(edges_table, scope))).all()
            node_data = _provenance(conn, scope, NODE, None)
            edge_data = _provenance(conn, scope, EDGE, None)
        return [_node(row, node_data) for row in node_rows], [_edge(row, edge_data) for row in edge_rows]

    def counts(self, scope: Scope) -> tuple[int, int]:
        with _translated(), self._engine.connect() as conn:
            nodes = conn.scalar(sa.select(sa.func.count()).where(_in_scope(nodes_table, scope)))
            edges = conn.scalar(sa.select(sa.func.count()).where(_in_scope(edges_table, scope)))
        return int(nodes or 0), int(edges or 0)

    def close(self) -> None:
        self._engine.dispose()

    def _upsert(
        self, conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]], update: tuple[str, ...]
    ) -> None:
        if not rows:
            return
        stmt = self._insert(table)
        keys = [column.name for column in table.primary_key.columns]
        upsert = stmt.on_conflict_do_update(
            index_elements=keys, set_={name: stmt.excluded[name] for name in update}
        )
        for batch in _batches(rows):
            conn.execute(upsert, batch)

    def _add_provenance(self, conn: sa.Connection, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        stmt = self._insert(provenance_table).on_conflict_do_nothing()
        for batch in _batches(rows):
            conn.execute(stmt, batch)

    def _insert(self, table: sa.Table) -> Any:
        if self._engine.dialect.name == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)


def _batches(rows: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for start in range(0, len(rows), BATCH_SIZE):
        yield rows[start : start + BATCH_SIZE]


def _bound(scope: Scope) -> dict[str, str]:
    """The scope's values for a `_prepared` read."""
    return {"tenant": scope.tenant, "dataset": scope.dataset}


def _in_scope(table: sa.Table, scope: Scope) -> sa.ColumnElement[bool]:
    return sa.and_(table.c.tenant == scope.tenant, table.c.dataset == scope.dataset)


def _stored(conn: sa.Connection, scope: Scope, table: sa.Table, ids: list[str]) -> list[Any]:
    """The stored nodes (or edges) of these ids, without their data ids: only their properties count."""
    read = _node if table is nodes_table else _edge
    found: list[Any] = []
    for batch in chunked(ids, BATCH_SIZE):
        query = sa.select(table).where(_in_scope(table, scope), table.c.id.in_(batch))
        found.extend(read(row, {}) for row in conn.execute(query))
    return found


def _existing_node_ids(conn: sa.Connection, scope: Scope, node_ids: set[str]) -> set[str]:
    present: set[str] = set()
    for batch in chunked(sorted(node_ids), BATCH_SIZE):
        query = sa.select(nodes_table.c.id).where(_in_scope(nodes_table, scope), nodes_table.c.id.in_(batch))
        present.update(conn.scalars(query))
    return present


def _touched(conn: sa.Connection, scope: Scope, data_ids: list[str]) -> dict[str, list[str]]:
    """Node and edge ids supported by any of the data ids."""
    table = provenance_table
    found: dict[str, list[str]] = {NODE: [], EDGE: []}
    for batch in chunked(data_ids, BATCH_SIZE):
        query = sa.select(table.c.kind, table.c.item_id).where(
            _in_scope(table, scope), table.c.data_id.in_(batch)
        )
        for kind, item_id in conn.execute(query.distinct()):
            found[kind].append(item_id)
    return found


def _edges_touching(conn: sa.Connection, scope: Scope, node_ids: list[str]) -> list[str]:
    table = edges_table
    found: list[str] = []
    for batch in chunked(node_ids, BATCH_SIZE):
        found.extend(row.id for row in _touching_rows(conn, _in_scope(table, scope), batch, table.c.id))
    return list(dict.fromkeys(found))


def _touching_rows(
    conn: sa.Connection, where: sa.ColumnElement[bool], node_ids: list[str], *columns: Any
) -> Iterator[sa.Row[Any]]:
    """The rows of the edges (matching `where`) with an end among the nodes: an edge with both ends
    there comes twice.

    Two searches, one per end's index: SQLite answers `source IN (..) OR target IN (..)` by
    reading every edge of the scope.
    """
    table = edges_table
    for end in (table.c.source_id, table.c.target_id):
        yield from conn.execute(sa.select(*(columns or (table,))).where(where, end.in_(node_ids)))


def _touching_shapes(
    conn: sa.Connection, where: sa.ColumnElement[bool], node_ids: list[str]
) -> list[EdgeShape]:
    """The shapes of the edges (matching `where`) with an end among the nodes, each once."""
    found: dict[str, EdgeShape] = {}
    for batch in chunked(node_ids, BATCH_SIZE):
        for row in _touching_rows(conn, where, batch, *SHAPE_COLUMNS):
            found[row.id] = EdgeShape(row.id, row.source_id, row.target_id, row.relationship)
    return list(found.values())


def _delete_rows(conn: sa.Connection, scope: Scope, table: sa.Table, column: Any, values: list[str]) -> None:
    for batch in chunked(values, BATCH_SIZE):
        conn.execute(sa.delete(table).where(_in_scope(table, scope), column.in_(batch)))


def _provenance(
    conn: sa.Connection, scope: Scope, kind: str, item_ids: list[str] | None
) -> dict[str, list[str]]:
    """Data ids per item, sorted; every item of the kind in the scope when `item_ids` is None."""
    table = provenance_table
    data_ids: dict[str, list[str]] = {}
    if item_ids is None:
        every = sa.select(table.c.item_id, table.c.data_id).where(
            _in_scope(table, scope), table.c.kind == kind
        )
        rows: list[Any] = list(conn.execute(every))
    else:
        bound = {**_bound(scope), "kind": kind}
        rows = [
            row
            for batch in chunked(item_ids, BATCH_SIZE)
            for row in conn.execute(PROVENANCE_OF, {**bound, "ids": batch})
        ]
    for item_id, data_id in rows:
        data_ids.setdefault(item_id, []).append(data_id)
    # Sorted here, not in SQL: a database collation would order differently from the other stores.
    return {item_id: sorted(found) for item_id, found in data_ids.items()}


def _json(properties: dict[str, Any]) -> str:
    try:
        return json.dumps(properties, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"graph properties must be JSON-serializable: {exc}") from exc


def _node_row(scope: Scope, node: GraphNode) -> dict[str, Any]:
    return {
        "tenant": scope.tenant,
        "dataset": scope.dataset,
        "id": node.id,
        "type": node.type,
        "properties": _json(node.properties),
    }


def _edge_row(scope: Scope, edge: GraphEdge) -> dict[str, Any]:
    return {
        "tenant": scope.tenant,
        "dataset": scope.dataset,
        "id": edge.id,
        "source_id": edge.source_id,
        "target_id": edge.target_id,
        "relationship": edge.relationship,
        "properties": _json(edge.properties),
    }


def _provenance_rows(scope: Scope, kind: str, items: Sequence[GraphNode | GraphEdge]) -> list[dict[str, Any]]:
    return [
        {
            "tenant": scope.tenant,
            "dataset": scope.dataset,
            "kind": kind,
            "item_id": item.id,
            "data_id": data_id,
        }
        for item in items
        for data_id in item.data_ids
    ]


def _node(row: sa.Row[Any], data_ids: dict[str, list[str]]) -> GraphNode:
    return GraphNode(
        id=row.id, type=row.type, properties=json.loads(row.properties), data_ids=data_ids.get(row.id, [])
    )


def _edge(row: sa.Row[Any], data_ids: dict[str, list[str]]) -> GraphEdge:
    return GraphEdge(
        id=row.id,
        source_id=row.source_id,
        target_id=row.target_id,
        relationship=row.relationship,
        properties=json.loads(row.properties),
        data_ids=data_ids.get(row.id, []),
    )


def _translated() -> AbstractContextManager[None]:
    return translated_sql("graph database")
