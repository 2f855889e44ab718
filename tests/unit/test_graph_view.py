"""The graph view's data: entities and relations only, the best connected when there are too
many, sources cited, and nothing in a name that can break out of the page's script."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kenning.pipeline.errors import NotFound
from kenning.pipeline.models import GraphEdge, GraphNode, Scope
from kenning.pipeline.permission import Caller
from kenning.workers.control.graph_view import dataset_view, graph_view, payload, render_html
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

SCOPE = Scope(tenant="t", dataset="d")


def entity(i: int, name: str | None = None, data_id: str = "item") -> GraphNode:
    props = {"name": name or f"E{i}", "entity_type": "Thing", "description": f"entity {i}"}
    return GraphNode(id=f"e{i}", type="Entity", properties=props, data_ids=[data_id])


def relation(a: int, b: int, relationship: str = "knows") -> GraphEdge:
    return GraphEdge(
        id=f"{a}-{b}",
        source_id=f"e{a}",
        target_id=f"e{b}",
        relationship=relationship,
        properties={"chunk_id": "c1"},
    )


def test_view_keeps_entities_and_their_relations_with_sources() -> None:
    chunk = GraphNode(id="c1", type="DocumentChunk", properties={"text": "E0 knows E1."}, data_ids=["item"])
    kind = GraphNode(id="k", type="EntityType", properties={"name": "Thing"})
    nodes = [entity(0), entity(1), chunk, kind]
    contains = GraphEdge(id="x", source_id="c1", target_id="e0", relationship="contains")
    is_a = GraphEdge(id="y", source_id="e0", target_id="k", relationship="is_a")
    view = graph_view(SCOPE, nodes, [relation(0, 1), contains, is_a], {"item": "notes.md", "other": "x"})

    assert [n.name for n in view.nodes] == ["E0", "E1"]
    assert [(link.source, link.target, link.chunk_id) for link in view.links] == [("e0", "e1", "c1")]
    assert view.nodes[0].chunk_ids == ["c1"] and view.nodes[0].data_ids == ["item"]
    assert view.chunks["c1"].text == "E0 knows E1." and view.items == {"item": "notes.md"}
    assert not view.sampled


def test_view_samples_the_best_connected_entities() -> None:
    # A star around e0 and a chain e5-e6: the hub and its leaves are the best connected.
    edges = [relation(0, i) for i in range(1, 5)] + [relation(5, 6), relation(6, 7)]
    view = graph_view(SCOPE, [entity(i) for i in range(9)], edges, max_nodes=5)

    assert [n.id for n in view.nodes] == ["e0", "e6", "e1", "e2", "e3"]
    assert view.sampled and view.total_nodes == 9 and view.total_links == 6
    assert all(link.source in {"e0"} for link in view.links) and len(view.links) == 3


def test_names_cannot_end_the_pages_script() -> None:
    hostile = "</script><script>alert(1)</script><!-- \u2028"
    page = render_html(graph_view(SCOPE, [entity(0, hostile)], []))

    data = re.search(r'<script id="graph-data" type="application/json">(.*?)</script>', page, re.S)
    assert data is not None
    assert json.loads(data.group(1))["nodes"][0]["name"] == hostile
    assert page.count("</script>") == 2 and "alert(1)" not in page.replace(data.group(1), "")


def test_no_view_of_a_dataset_that_is_missing_or_not_readable(tmp_path: Path) -> None:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        memory.add_text("Ada Lovelace wrote the first program.", "notes")
        assert dataset_view(memory, "notes").dataset == "notes"
        with pytest.raises(NotFound):
            dataset_view(memory, "missing")
        stranger = memory.as_caller(Caller(tenant=memory.settings.tenant, user="stranger"))
        with pytest.raises(NotFound, match="no dataset 'notes'"):
            dataset_view(stranger, "notes")


def typed(i: int, entity_type: str) -> GraphNode:
    props = {"name": f"E{i}", "entity_type": entity_type}
    return GraphNode(id=f"e{i}", type="Entity", properties=props)


def colours(view_payload: dict[str, object]) -> dict[str, str]:
    """Each drawn entity's type name -> the colour it is drawn in, as the page reads them."""
    types = view_payload["types"]
    assert isinstance(types, list)
    found: dict[str, set[str]] = {}
    for node in view_payload["nodes"]:  # type: ignore[attr-defined]
        kind = types[node["type"]]
        found.setdefault(kind["name"], set()).add(kind["colour"])
    assert all(len(held) == 1 for held in found.values()), found
    return {name: held.pop() for name, held in found.items()}


def test_a_type_has_one_colour_in_the_full_and_the_sampled_view() -> None:
    # Given entities of six types, the best connected ones of types late in the alphabet
    kinds = ["Zone", "Year", "Person", "Organization", "Event", "Concept"]
    nodes = [typed(i, kinds[i % len(kinds)]) for i in range(30)]
    edges = [relation(i, j) for i in range(2) for j in range(2, 30) if j % 6 in (0, 1)]
    full, sampled = graph_view(SCOPE, nodes, edges), graph_view(SCOPE, nodes, edges, max_nodes=8)
    assert sampled.sampled and {n.type for n in sampled.nodes} < {n.type for n in full.nodes}

    # Then every type drawn in both views is drawn in one colour, the same in each
    whole, part = colours(payload(full)), colours(payload(sampled))
    assert part == {name: whole[name] for name in part}
    # And the legend's list of types is the dataset's, whatever is drawn
    assert payload(full)["types"] == payload(sampled)["types"]


def test_types_are_named_one_way() -> None:
    # Given entities with no type, a lower-case type and its capitalised twin
    nodes = [typed(0, ""), typed(1, "person"), typed(2, "Person"), typed(3, " place ")]
    view = payload(graph_view(SCOPE, nodes, []))
    # Then the page names each type once, capitalised, an untyped entity as "Entity"
    assert [kind["name"] for kind in view["types"]] == ["Entity", "Person", "Place"]
    names = {node["name"]: view["types"][node["type"]]["name"] for node in view["nodes"]}
    assert names == {"E0": "Entity", "E1": "Person", "E2": "Person", "E3": "Place"}
