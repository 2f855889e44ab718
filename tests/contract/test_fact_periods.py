"""When facts held, on every graph store: statements merged across writes, periods worked out and
kept as written, and what a forgotten item said dropped (`kenning.pipeline.validity`)."""

from __future__ import annotations

from typing import Any

from kenning.pipeline.models import GraphEdge, GraphNode
from kenning.pipeline.ports import GraphStore
from kenning.pipeline.validity import FactRules, settle, statement
from tests.contract import test_graph_store as contract
from tests.contract.test_graph_store import NewScope

# The graph store contract's fixtures: every backend, each test in a scope of its own.
store, new_scope, made_scopes = contract.store, contract.new_scope, contract.made_scopes

RULES = FactRules()


def entity(node_id: str, data_ids: list[str]) -> GraphNode:
    return GraphNode(id=node_id, type="Entity", properties={"name": node_id.title()}, data_ids=data_ids)


def fact(target: str, relationship: str, data_id: str, at: str) -> GraphEdge:
    said = [statement(data_id, f"chunk-{data_id}", at, f"2026-01-0{data_id[-1]}T00:00:00Z")]
    return GraphEdge(
        id=f"ana-{relationship}-{target}",
        source_id="ana",
        target_id=target,
        relationship=relationship,
        properties={
            "description": f"Ana {relationship} {target}",
            "chunk_id": f"chunk-{data_id}",
            "said": said,
        },
        data_ids=[data_id],
    )


def edges_of(graph: GraphStore, scope: Any) -> dict[str, GraphEdge]:
    return {edge.id: edge for edge in graph.get_edges(scope, ["ana"])}


def test_a_newer_value_ends_the_older_and_forget_brings_it_back(
    store: GraphStore, new_scope: NewScope
) -> None:
    scope = new_scope()
    # Given Ana in Oslo (said twice) and then in Berlin
    store.upsert_nodes(
        scope, [entity("ana", ["d1", "d2", "d3"]), entity("oslo", ["d1", "d3"]), entity("berlin", ["d2"])]
    )
    store.upsert_edges(scope, [fact("oslo", "live_in", "d1", "2023-01-10")])
    store.upsert_edges(scope, [fact("oslo", "live_in", "d3", "2023-06-01")])
    store.upsert_edges(scope, [fact("berlin", "moved_to", "d2", "2024-05")])

    # When the facts around Ana are settled
    settled = settle(store, scope, ["ana"], RULES)

    # Then Oslo held from its first statement until the move, and the store kept what was written
    edges = edges_of(store, scope)
    oslo, berlin = edges["ana-live_in-oslo"], edges["ana-moved_to-berlin"]
    assert [s["data_id"] for s in oslo.properties["said"]] == ["d1", "d3"]
    assert oslo.properties["periods"] == [
        {
            "from": "2023-01-10",
            "from_by": "d1",
            "recorded_at": "2026-01-01T00:00:00Z",
            "to": "2024-05",
            "to_by": "d2",
            "retired_at": "2026-01-02T00:00:00Z",
            "retired_by": "ana-moved_to-berlin",
        }
    ]
    assert (oslo.properties["valid_to"], oslo.properties["retired_by"]) == ("2024-05", berlin.id)
    assert berlin.properties["valid_from"] == "2024-05" and "valid_to" not in berlin.properties
    assert {edge.id for edge in settled.changed} == {oslo.id, berlin.id}
    assert settle(store, scope, ["ana"], RULES).changed == []  # settled again: nothing to write

    # When the move and the second Oslo statement are forgotten
    store.remove_data(scope, ["d2", "d3"])
    settle(store, scope, ["ana", "oslo"], RULES)

    # Then Oslo holds again, and nothing of what d3 said stays
    oslo = edges_of(store, scope)["ana-live_in-oslo"]
    assert list(edges_of(store, scope)) == ["ana-live_in-oslo"]
    assert oslo.data_ids == ["d1"] and [s["data_id"] for s in oslo.properties["said"]] == ["d1"]
    assert oslo.properties["periods"][0]["to"] is None and "retired_by" not in oslo.properties
    assert "d3" not in str(oslo.properties) and "d2" not in str(oslo.properties)
