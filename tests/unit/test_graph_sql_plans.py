"""The SQL graph store's reads search its indexes on SQLite: none reads every edge of a dataset."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.storage.graph.sql import SqlGraphStore
from kenning.storage.sql.engine import open_engine

SCOPE = Scope(tenant="t", dataset="d")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = open_engine(f"sqlite:///{tmp_path / 'graph.db'}")
    yield engine
    engine.dispose()


def chain_graph(store: SqlGraphStore, length: int) -> None:
    """Nodes n0..n(length-1), an edge from each to the next."""
    nodes = [
        GraphNode(id=f"n{i}", type="Entity", properties={"name": f"n{i}"}, data_ids=["a"])
        for i in range(length)
    ]
    edges = [
        GraphEdge(
            id=f"e{i}", source_id=f"n{i}", target_id=f"n{i + 1}", relationship="related_to", data_ids=["a"]
        )
        for i in range(length - 1)
    ]
    store.upsert_nodes(SCOPE, nodes)
    store.upsert_edges(SCOPE, edges)


def edge_plans(engine: sa.Engine) -> tuple[list[str], Any]:
    """Query plans of the statements on graph_edges run while listening, and the listener to stop."""
    plans: list[str] = []

    def explain(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "graph_edges" in statement and statement.lstrip().upper().startswith("SELECT"):
            rows = cursor.connection.execute(f"EXPLAIN QUERY PLAN {statement}", parameters).fetchall()
            plans.append(" / ".join(str(row[-1]) for row in rows))

    sa.event.listen(engine, "before_cursor_execute", explain)
    return plans, explain


def test_edges_around_nodes_are_found_through_the_end_indexes(engine: sa.Engine) -> None:
    # Given a graph of a few hundred edges
    store = SqlGraphStore(engine)
    chain_graph(store, 300)
    plans, listener = edge_plans(engine)

    # When the edges around some nodes are read, as retrievers and forget do
    try:
        around = store.get_edges(SCOPE, ["n10", "n200"])
        near = store.neighbourhood(SCOPE, ["n10"], hops=2)
        store.delete_elements(SCOPE, ["n299"], [])
    finally:
        sa.event.remove(engine, "before_cursor_execute", listener)

    # Then the answers are right, and every search of graph_edges goes through an end's index
    assert sorted(edge.id for edge in around) == ["e10", "e199", "e200", "e9"]
    assert sorted(edge.id for edge in near.edges) == ["e10", "e11", "e8", "e9"]
    assert plans
    for plan in plans:
        assert "source_id=?" in plan or "target_id=?" in plan, plan


def test_edges_among_nodes_are_read_by_their_sources_not_their_many_incoming_edges(
    engine: sa.Engine,
) -> None:
    # Given entities each of many chunks contains (many incoming edges) and a few facts among them
    store = SqlGraphStore(engine)
    entities = [GraphNode(id=f"e{i}", type="Entity", data_ids=["a"]) for i in range(3)]
    chunks = [GraphNode(id=f"c{i}", type="DocumentChunk", data_ids=["a"]) for i in range(50)]
    store.upsert_nodes(SCOPE, [*entities, *chunks])
    contains = [
        GraphEdge(
            id=f"{c.id}-{e.id}", source_id=c.id, target_id=e.id, relationship="contains", data_ids=["a"]
        )
        for c in chunks
        for e in entities
    ]
    facts = [
        GraphEdge(id="f01", source_id="e0", target_id="e1", relationship="knows", data_ids=["a"]),
        GraphEdge(id="f12", source_id="e1", target_id="e2", relationship="knows", data_ids=["a"]),
    ]
    store.upsert_edges(SCOPE, [*contains, *facts])
    plans, listener = edge_plans(engine)

    # When the edges among the entities are read, as GRAPH_COMPLETION does
    try:
        among = store.get_edges(SCOPE, ["e0", "e1", "e2"], among=True)
    finally:
        sa.event.remove(engine, "before_cursor_execute", listener)

    # Then they are the facts, found through the source index alone
    assert sorted(edge.id for edge in among) == ["f01", "f12"]
    assert plans
    for plan in plans:
        assert "ix_graph_edges_source" in plan and "target_id=?" not in plan, plan
