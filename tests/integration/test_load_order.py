"""Node and edge properties do not depend on the order batches are loaded in.

Several data items (and chunks) produce the same entity or fact; each writes its own
description and provenance. Whatever the order of the load batches (an undisturbed run, a run
resumed after a fault, batches redelivered), every property of every element ends the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.assembly import assemble, graph_edge, graph_node
from kenning.pipeline.models import (
    ChunkRecord,
    DocumentRecord,
    Extraction,
    KnowledgeEdge,
    KnowledgeGraph,
    KnowledgeNode,
    Scope,
    stable_id,
)
from kenning.pipeline.ports import GraphStore
from kenning.storage.graph.cypher import CypherGraphStore
from kenning.storage.graph.falkordb import FalkorGraphStore
from kenning.storage.graph.memory import MemoryGraphStore
from kenning.storage.graph.sql import SqlGraphStore
from kenning.storage.sql.engine import open_engine

# Written at load time, or naming the run: they differ between any two loads.
VOLATILE = frozenset({"created_at", "updated_at", "source_run"})
BACKENDS = ["memory", "sql-sqlite", pytest.param("falkordb", marks=pytest.mark.falkordb)]

Opener = Callable[[str], GraphStore]


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a fresh, empty store each time it is called; closes them all after the test."""
    opened: list[GraphStore] = []
    scopes: list[Scope] = []

    def open_one(name: str) -> GraphStore:
        backend = request.param
        if backend == "memory":
            store: GraphStore = MemoryGraphStore()
        elif backend == "sql-sqlite":
            store = SqlGraphStore(open_engine(f"sqlite:///{tmp_path / name}.db"))
        else:
            url = request.getfixturevalue("falkordb_url")
            store = FalkorGraphStore(url, graph_name=f"kenning_order_{name}_{uuid.uuid4().hex[:8]}")
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        if isinstance(store, CypherGraphStore):
            for scope in scopes:
                store._delete_scope(scope)
        store.close()


def extraction(item: str, chunk: int) -> Extraction:
    """Every chunk names Ada and Babbage and their fact, each in its own words."""
    said = f"as item {item} chunk {chunk} puts it"
    return Extraction(
        graph=KnowledgeGraph(
            nodes=[
                KnowledgeNode(
                    id="ada",
                    name="Ada Lovelace",
                    type="Person",
                    description=f"Ada Lovelace, a writer, {said}",
                ),
                KnowledgeNode(
                    id="cb", name="Charles Babbage", type="Person", description=f"Babbage, inventor, {said}"
                ),
                KnowledgeNode(id=f"x{item}{chunk}", name=f"Thing {item}{chunk}", type="Concept"),
            ],
            edges=[
                KnowledgeEdge(source="ada", target="cb", relationship="worked with", description=said),
                KnowledgeEdge(source="ada", target=f"x{item}{chunk}", relationship="mentions"),
            ],
        ),
        summary=f"Summary of item {item} chunk {chunk}.",
    )


def batches(scope: Scope) -> list[list[tuple[ChunkRecord, DocumentRecord, Extraction]]]:
    """One batch per chunk: three data items of two chunks each."""
    found = []
    for item in ("a", "b", "c"):
        data_id = stable_id("item", item)
        document = DocumentRecord(
            id=stable_id("doc", item), dataset_id="ds", data_id=data_id, name=item, kind="text"
        )
        for index in range(2):
            text = f"Text of item {item}, chunk {index}."
            record = ChunkRecord(
                id=stable_id("chunk", item, str(index)),
                dataset_id="ds",
                document_id=document.id,
                data_id=data_id,
                index=index,
                text=text,
                token_count=8,
                text_hash=stable_id(text),
            )
            found.append([(record, document, extraction(item, index))])
    return found


def load(store: GraphStore, scope: Scope, order: list[int]) -> None:
    every = batches(scope)
    hashes = {chunks[0][0].data_id: f"hash-{chunks[0][0].data_id[:8]}" for chunks in every}
    for position in order:
        write(store, scope, every[position], hashes)


def write(
    store: GraphStore,
    scope: Scope,
    chunks: list[tuple[ChunkRecord, DocumentRecord, Extraction]],
    hashes: dict[str, str],
) -> None:
    """Assemble one load batch and write its nodes and edges, as the load step does."""
    assembly = assemble("run-1", scope, chunks, hashes)
    store.upsert_nodes(scope, [graph_node(node) for node in assembly.nodes.values()])
    store.upsert_edges(scope, [graph_edge(e, assembly.chunk_of[e.id]) for e in assembly.edges.values()])


def snapshot(store: GraphStore, scope: Scope) -> dict[str, Any]:
    nodes, edges = store.export(scope)
    return {
        **{n.id: (n.type, _stable(n.properties), sorted(n.data_ids)) for n in nodes},
        **{e.id: (e.relationship, _stable(e.properties), sorted(e.data_ids)) for e in edges},
    }


def _stable(properties: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in properties.items() if key not in VOLATILE}


def test_every_property_is_the_same_whatever_the_load_order(open_store: Opener) -> None:
    # Given the same six batches, loaded in order into one store and in three other orders into others
    scope = Scope(tenant="acme", dataset=f"order-{uuid.uuid4().hex[:8]}")
    orders = [[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [3, 0, 5, 1, 4, 2], [1, 3, 5, 0, 2, 4]]
    snapshots = []
    for number, order in enumerate(orders):
        store = open_store(f"s{number}")
        load(store, scope, order)
        snapshots.append(snapshot(store, scope))
    # Then every node and edge has the same type, properties and data ids in all of them
    reference = snapshots[0]
    assert len(reference) > 20
    for other in snapshots[1:]:
        assert other.keys() == reference.keys()
        differing = [element for element in reference if other[element] != reference[element]]
        assert differing == [], [(reference[e], other[e]) for e in differing[:3]]


def test_the_smallest_source_wins_and_an_update_from_the_same_source_replaces(open_store: Opener) -> None:
    # Given Ada, loaded from the three items in reverse order
    scope = Scope(tenant="acme", dataset=f"order-{uuid.uuid4().hex[:8]}")
    store = open_store("one")
    load(store, scope, [5, 4, 3, 2, 1, 0])
    ada = next(n for n in store.export(scope)[0] if n.properties.get("name") == "Ada Lovelace")
    # Then her description is the one from the smallest data item id and chunk id
    sources = sorted((records[0][0].data_id, records[0][0].id, records[0][2]) for records in batches(scope))
    assert ada.properties["source_data_id"] == sources[0][0]
    assert ada.properties["source_chunk"] == sources[0][1]
    assert ada.properties["description"] == sources[0][2].graph.nodes[0].description
    assert len(ada.data_ids) == 3
    # When a later write from that same source changes a property (as feedback weights do)
    store.upsert_nodes(scope, [ada.model_copy(update={"properties": {**ada.properties, "weight": 2.0}})])
    # Then it is kept
    [after] = store.get_nodes(scope, [ada.id])
    assert after.properties["weight"] == 2.0


def test_every_property_is_the_same_whatever_the_batches(open_store: Opener) -> None:
    # Given the same six chunks, loaded as one batch in order, one batch in reverse, and three
    # batches of two in another order (as a resumed run may cut them)
    scope = Scope(tenant="acme", dataset=f"order-{uuid.uuid4().hex[:8]}")
    every = [records for batch in batches(scope) for records in batch]
    groupings = [[every], [every[::-1]], [[every[5], every[2]], [every[4], every[0]], [every[3], every[1]]]]
    hashes = {records[0].data_id: f"hash-{records[0].data_id[:8]}" for records in every}
    snapshots = []
    for number, grouping in enumerate(groupings):
        store = open_store(f"g{number}")
        for chunks in grouping:
            write(store, scope, chunks, hashes)
        snapshots.append(snapshot(store, scope))
    # Then every node and edge has the same properties in all of them
    reference = snapshots[0]
    for other in snapshots[1:]:
        differing = [element for element in reference if other.get(element) != reference[element]]
        assert differing == [], [(reference[e], other.get(e)) for e in differing[:3]]
