"""One contract for every GraphStore: the in-memory twin, SQL (SQLite, PostgreSQL), FalkorDB, Memgraph."""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.pipeline.models import EdgeShape, GraphEdge, GraphNode, Scope
from kenning.pipeline.ports import GraphStore
from kenning.storage.graph.cypher import (
    CypherGraphStore,
    label_of,
    upsert_edge_statements,
    upsert_node_statements,
)
from kenning.storage.graph.falkordb import FalkorGraphStore, graph_key
from kenning.storage.graph.memgraph import MemgraphGraphStore
from kenning.storage.graph.memory import MemoryGraphStore
from kenning.storage.graph.rules import edge_shape
from kenning.storage.graph.sql import SqlGraphStore
from kenning.storage.sql.engine import open_engine
from tests.services import free_port

MEMGRAPH_URL = os.environ.get("KENNING_MEMGRAPH_URL", "")

HOSTILE = [
    "'}) DETACH DELETE n //",
    '"}) MATCH (m) DETACH DELETE m //',
    "`) DETACH DELETE n //",
    "x` {id: 'y'}) DETACH DELETE n //",
    "'; DROP TABLE graph_nodes; --",
    "\\'; DELETE FROM graph_edges; --",
    "Robert'); DROP TABLE students;--",
    'CYPHER tenant="x" MATCH (n) DETACH DELETE n',
    "$tenant",
    "{tenant}",
    "\\",
]

BACKENDS = [
    "memory",
    "sql-sqlite",
    # The SQL graph with its edges held in memory, read inline: every shape comes from them.
    "sql-sqlite-held",
    pytest.param("sql-postgres", marks=pytest.mark.postgres),
    pytest.param("sql-postgres-held", marks=pytest.mark.postgres),
    pytest.param("falkordb", marks=pytest.mark.falkordb),
    pytest.param(
        "memgraph",
        marks=[
            pytest.mark.memgraph,
            pytest.mark.skipif(not MEMGRAPH_URL, reason="KENNING_MEMGRAPH_URL is not set"),
        ],
    ),
]

NewScope = Callable[..., Scope]


@pytest.fixture
def made_scopes() -> list[Scope]:
    return []


@pytest.fixture
def new_scope(made_scopes: list[Scope]) -> NewScope:
    """A scope no other test uses; the store fixture removes it from shared servers afterwards."""

    def make(tenant: str = "", dataset: str = "") -> Scope:
        token = uuid.uuid4().hex[:10]
        scope = Scope(tenant=f"{tenant}tenant-{token}", dataset=f"{dataset}dataset-{token}")
        made_scopes.append(scope)
        return scope

    return make


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path, made_scopes: list[Scope]) -> Iterator[GraphStore]:
    opened = _open_store(request, tmp_path)
    try:
        yield opened
    finally:
        if isinstance(opened, CypherGraphStore):
            for scope in made_scopes:
                opened._delete_scope(scope)
        opened.close()


def _open_store(request: pytest.FixtureRequest, tmp_path: Path) -> GraphStore:
    backend = request.param
    if backend == "memory":
        return MemoryGraphStore()
    if backend.startswith("sql-"):
        sqlite_url = f"sqlite:///{tmp_path / 'graph.db'}"
        url = sqlite_url if backend.startswith("sql-sqlite") else request.getfixturevalue("postgres_url")
        return SqlGraphStore(open_engine(url), snapshots="inline" if backend.endswith("-held") else "off")
    if backend == "falkordb":
        return FalkorGraphStore(request.getfixturevalue("falkordb_url"), graph_name="kenning_contract")
    user = os.environ.get("KENNING_MEMGRAPH_USER", "")
    return MemgraphGraphStore(MEMGRAPH_URL, user, os.environ.get("KENNING_MEMGRAPH_PASSWORD", ""))


def node(
    node_id: str, type_: str = "Entity", data_ids: tuple[str, ...] = ("d1",), **properties: Any
) -> GraphNode:
    return GraphNode(id=node_id, type=type_, properties=properties, data_ids=list(data_ids))


def edge(
    source: str,
    target: str,
    relationship: str = "knows",
    data_ids: tuple[str, ...] = ("d1",),
    **properties: Any,
) -> GraphEdge:
    return GraphEdge(
        id=f"{source}-{relationship}-{target}",
        source_id=source,
        target_id=target,
        relationship=relationship,
        properties=properties,
        data_ids=list(data_ids),
    )


def by_id(items: list[Any]) -> dict[str, Any]:
    return {item.id: item for item in items}


RICH: dict[str, Any] = {
    "name": "Ada Lovelace",
    "count": 3,
    "score": 0.1 + 0.2,
    "ratio": 1.5,
    "flag": True,
    "tags": ["a", "b"],
    "empty": [],
    "nested": {"born": 1815, "places": ["London", {"city": "Marylebone"}]},
    "nothing": None,
    "huge": 2**70,
}


def test_upserted_nodes_and_edges_read_back(store: GraphStore, new_scope: NewScope) -> None:
    # Given two nodes with rich properties and an edge between them
    scope = new_scope()
    a, b = node("a", "Person", **RICH), node("b", "Place", name="London")
    ab = edge("a", "b", "born_in", description="Ada was born in London")

    # When they are upserted
    store.upsert_nodes(scope, [a, b])
    store.upsert_edges(scope, [ab])

    # Then each reads back exactly, and unknown ids are simply absent
    assert by_id(store.get_nodes(scope, ["a", "b", "missing"])) == {"a": a, "b": b}
    assert store.get_edges(scope, ["a"]) == [ab]
    assert store.get_nodes(scope, []) == []
    assert store.get_edges(scope, []) == []


def test_reupsert_is_idempotent_overwrites_properties_and_unions_data_ids(
    store: GraphStore, new_scope: NewScope
) -> None:
    scope = new_scope()
    first_nodes = [node("a", name="A", old="gone soon"), node("b", name="B")]
    first_edge = edge("a", "b", description="first", data_ids=("d1",))
    store.upsert_nodes(scope, first_nodes)
    store.upsert_edges(scope, [first_edge])

    # When the same data is written again, nothing is duplicated
    store.upsert_nodes(scope, first_nodes)
    store.upsert_edges(scope, [first_edge])
    assert store.counts(scope) == (2, 1)

    # When a later write brings new properties and new provenance
    store.upsert_nodes(scope, [node("a", data_ids=("d3", "d2", "d1"), name="A2")])
    store.upsert_edges(scope, [edge("a", "b", description="second", data_ids=("d2",))])

    # Then properties are replaced and data ids unioned, still one of each
    stored = by_id(store.get_nodes(scope, ["a"]))["a"]
    assert stored.properties == {"name": "A2"}
    assert stored.data_ids == ["d1", "d2", "d3"]
    [stored_edge] = store.get_edges(scope, ["a"])
    assert stored_edge.properties == {"description": "second"}
    assert stored_edge.data_ids == ["d1", "d2"]
    assert store.counts(scope) == (2, 1)


def test_duplicates_within_one_call_collapse(store: GraphStore, new_scope: NewScope) -> None:
    scope = new_scope()
    store.upsert_nodes(
        scope, [node("a", name="one", data_ids=("d1",)), node("b"), node("a", name="two", data_ids=("d2",))]
    )
    store.upsert_edges(scope, [edge("a", "b", data_ids=("d1",)), edge("a", "b", data_ids=("d9",), w=2)])

    [a] = store.get_nodes(scope, ["a"])
    assert (a.properties, a.data_ids) == ({"name": "two"}, ["d1", "d2"])
    [ab] = store.get_edges(scope, ["b"])
    assert (ab.properties, ab.data_ids) == ({"w": 2}, ["d1", "d9"])
    assert store.counts(scope) == (2, 1)


def test_retyped_node_reads_back_with_its_new_type(store: GraphStore, new_scope: NewScope) -> None:
    scope = new_scope()
    store.upsert_nodes(scope, [node("a", "Person")])
    store.upsert_nodes(scope, [node("a", "Organization")])

    assert [n.type for n in store.get_nodes(scope, ["a"])] == ["Organization"]


def test_edges_whose_endpoint_is_missing_are_skipped(store: GraphStore, new_scope: NewScope) -> None:
    scope = new_scope()
    store.upsert_nodes(scope, [node("a"), node("b")])

    store.upsert_edges(
        scope, [edge("a", "ghost"), edge("ghost", "a"), edge("ghost", "phantom"), edge("a", "b")]
    )

    assert [e.id for e in store.export(scope)[1]] == ["a-knows-b"]
    assert store.get_edges(scope, ["ghost"]) == []
    assert store.counts(scope) == (2, 1)


def test_get_edges_returns_every_edge_touching_any_of_the_ids(store: GraphStore, new_scope: NewScope) -> None:
    # Given a chain a -> b -> c -> d and a loop on d
    scope = new_scope()
    store.upsert_nodes(scope, [node(i) for i in "abcd"])
    chain = [edge("a", "b"), edge("b", "c"), edge("c", "d"), edge("d", "d", "self")]
    store.upsert_edges(scope, chain)

    def touching(*ids: str) -> list[str]:
        return sorted(e.id for e in store.get_edges(scope, list(ids)))

    assert touching("b") == ["a-knows-b", "b-knows-c"]
    assert touching("a", "b") == ["a-knows-b", "b-knows-c"]
    assert touching("a", "d") == ["a-knows-b", "c-knows-d", "d-self-d"]
    assert touching("a", "a", "nowhere") == ["a-knows-b"]
    assert by_id(store.get_edges(scope, ["c"]))["c-knows-d"] == chain[2]


def test_get_edges_among_returns_only_edges_between_the_ids(store: GraphStore, new_scope: NewScope) -> None:
    # Given a chain a -> b -> c -> d and a loop on d
    scope = new_scope()
    store.upsert_nodes(scope, [node(i) for i in "abcd"])
    store.upsert_edges(scope, [edge("a", "b"), edge("b", "c"), edge("c", "d"), edge("d", "d", "self")])

    def among(*ids: str) -> list[str]:
        return sorted(e.id for e in store.get_edges(scope, list(ids), among=True))

    assert among("a", "b") == ["a-knows-b"]
    assert among("b", "c", "d") == ["b-knows-c", "c-knows-d", "d-self-d"]
    assert among("a", "c") == []
    assert among("d") == ["d-self-d"]


def test_reads_without_provenance_leave_data_ids_empty_and_nothing_else(
    store: GraphStore, new_scope: NewScope
) -> None:
    # Given nodes and an edge that several data items support
    scope = new_scope()
    store.upsert_nodes(scope, [node("a", data_ids=("d1", "d2"), name="A"), node("b", data_ids=("d3",))])
    store.upsert_edges(scope, [edge("a", "b", data_ids=("d1", "d3"), description="a knows b")])

    # When they are read without provenance, then they are the same but for their data ids
    def stripped(items: list[Any]) -> dict[str, Any]:
        return {item.id: item.model_copy(update={"data_ids": []}) for item in items}

    nodes = store.get_nodes(scope, ["a", "b"], provenance=False)
    assert [found.data_ids for found in nodes] == [[], []]
    assert by_id(nodes) == stripped(store.get_nodes(scope, ["a", "b"]))
    for among in (False, True):
        edges = store.get_edges(scope, ["a", "b"], among, provenance=False)
        assert edges and all(found.data_ids == [] for found in edges)
        assert by_id(edges) == stripped(store.get_edges(scope, ["a", "b"], among))
    # and a read with provenance still has them
    assert by_id(store.get_nodes(scope, ["a"]))["a"].data_ids == ["d1", "d2"]


def test_export_and_counts_cover_the_whole_scope(store: GraphStore, new_scope: NewScope) -> None:
    scope = new_scope()
    assert store.export(scope) == ([], [])
    assert store.counts(scope) == (0, 0)

    nodes = [node(f"n{i}", "Even" if i % 2 else "Odd", index=i) for i in range(7)]
    edges = [edge(f"n{i}", f"n{i + 1}", "next") for i in range(6)] + [edge("n0", "n6", "wraps")]
    store.upsert_nodes(scope, nodes)
    store.upsert_edges(scope, edges)

    exported_nodes, exported_edges = store.export(scope)
    assert by_id(exported_nodes) == by_id(nodes)
    assert by_id(exported_edges) == by_id(edges)
    assert store.counts(scope) == (7, 7)


def test_scopes_never_see_each_other(store: GraphStore, new_scope: NewScope) -> None:
    # Given the same node and edge ids written into two scopes with different content
    one, two = new_scope(), new_scope()
    store.upsert_nodes(one, [node("a", name="one", data_ids=("d1",)), node("b")])
    store.upsert_nodes(two, [node("a", "Other", name="two", data_ids=("d2",)), node("c")])
    store.upsert_edges(one, [edge("a", "b", note="one")])
    store.upsert_edges(two, [edge("a", "c", note="two")])

    # When an edge in scope two points at a node that only scope one holds, it is skipped
    store.upsert_edges(two, [edge("a", "b", note="crossing")])

    # Then each scope sees its own version of `a`, and only its own edges
    [a_one], [a_two] = store.get_nodes(one, ["a"]), store.get_nodes(two, ["a"])
    assert (a_one.properties, a_one.data_ids, a_one.type) == ({"name": "one"}, ["d1"], "Entity")
    assert (a_two.properties, a_two.data_ids, a_two.type) == ({"name": "two"}, ["d2"], "Other")
    assert [e.properties for e in store.get_edges(one, ["a", "b", "c"])] == [{"note": "one"}]
    assert [e.properties for e in store.get_edges(two, ["a", "b", "c"])] == [{"note": "two"}]
    assert store.get_nodes(two, ["b"]) == []
    assert store.counts(one) == (2, 1)
    assert store.counts(two) == (2, 1)
    assert {n.id for n in store.export(two)[0]} == {"a", "c"}


def test_scope_names_do_not_run_into_each_other(store: GraphStore, new_scope: NewScope) -> None:
    # "x/y" + "z" and "x" + "y/z" share a "tenant/dataset" string, yet are two scopes
    base = new_scope()
    left = Scope(tenant=f"{base.tenant}/y", dataset=base.dataset)
    right = Scope(tenant=base.tenant, dataset=f"y/{base.dataset}")
    store.upsert_nodes(left, [node("a", name="left")])
    store.upsert_nodes(right, [node("a", name="right")])
    try:
        assert [n.properties["name"] for n in store.get_nodes(left, ["a"])] == ["left"]
        assert [n.properties["name"] for n in store.get_nodes(right, ["a"])] == ["right"]
    finally:
        if isinstance(store, CypherGraphStore):
            store._delete_scope(left)
            store._delete_scope(right)


def test_hostile_strings_are_stored_verbatim_and_delete_nothing(
    store: GraphStore, new_scope: NewScope
) -> None:
    # Given bystanders in the same scope and in another one, with a hostile tenant name
    scope, bystander_scope = new_scope(HOSTILE[0]), new_scope(HOSTILE[1])
    store.upsert_nodes(scope, [node("keep-1"), node("keep-2")])
    store.upsert_edges(scope, [edge("keep-1", "keep-2")])
    store.upsert_nodes(bystander_scope, [node("keep-1"), node("keep-2")])
    store.upsert_edges(bystander_scope, [edge("keep-1", "keep-2")])

    # When nodes and edges made of injection strings are written
    hostile_nodes = [
        GraphNode(id=text, type=text, properties={"name": text, text: text}, data_ids=[text])
        for text in HOSTILE
    ]
    hostile_edges = [
        GraphEdge(
            id=f"edge {text}",
            source_id=text,
            target_id="keep-1",
            relationship=text,
            properties={"description": text},
            data_ids=[text],
        )
        for text in HOSTILE
    ]
    store.upsert_nodes(scope, hostile_nodes)
    store.upsert_edges(scope, hostile_edges)
    store.upsert_nodes(scope, hostile_nodes)

    # Then every string reads back verbatim and nothing else moved
    assert by_id(store.get_nodes(scope, HOSTILE)) == by_id(hostile_nodes)
    assert by_id(store.get_edges(scope, HOSTILE)) == by_id(hostile_edges)
    assert store.counts(scope) == (2 + len(HOSTILE), 1 + len(HOSTILE))
    assert store.counts(bystander_scope) == (2, 1)
    assert len(store.get_nodes(scope, ["keep-1", "keep-2"])) == 2


def test_unicode_long_and_awkward_properties_round_trip(store: GraphStore, new_scope: NewScope) -> None:
    scope = new_scope()
    long_text = "Zürich 東京 🙂 " * 40_000
    properties = {
        "name": "Ꮎⲣⲉⲛ 知识图谱 \u200b\u00e9\u0301 مرحبا",
        "long": long_text,
        "long_list": [f"item {i} ✓" for i in range(5_000)],
        "név ünicode": "ключ",
        "": "empty key",
        "with`backtick": 1,
        "nul": "before\x00after",
        "id": "not the id",
        "type": "not the type",
        "tenant": "not the tenant",
        "data_ids": ["not", "these"],
        "relationship": "not the relationship",
        "extra_json": "{}",
    }
    awkward = GraphNode(id="ü", type="Ünïcode", properties=properties, data_ids=["d1"])
    awkward_edge = GraphEdge(
        id="ü→z", source_id="ü", target_id="z", relationship="связь", properties=properties, data_ids=["d1"]
    )
    store.upsert_nodes(scope, [awkward, node("z")])
    store.upsert_edges(scope, [awkward_edge])

    assert store.get_nodes(scope, ["ü"]) == [awkward]
    assert store.get_edges(scope, ["ü"]) == [awkward_edge]


def test_properties_that_are_not_json_are_refused_before_anything_is_written(
    store: GraphStore, new_scope: NewScope
) -> None:
    scope = new_scope()
    with pytest.raises(StoreError):
        store.upsert_nodes(scope, [node("fine"), node("bad", value=object())])
    assert store.counts(scope) == (0, 0)


def test_five_thousand_nodes_and_ten_thousand_edges_round_trip(
    store: GraphStore, new_scope: NewScope
) -> None:
    scope = new_scope()
    types = ["Entity", "DocumentChunk", "TextSummary", "TextDocument", "EntityType"]
    relationships = [
        "mentions",
        "contains",
        "is_a",
        "made_from",
        "works_at",
        "located_in",
        "part_of",
        "knows",
    ]
    nodes = [
        node(f"node-{i}", types[i % 5], data_ids=(f"data-{i % 50}",), name=f"Name {i}", index=i)
        for i in range(5_000)
    ]
    edges = [
        edge(
            f"node-{i % 5_000}",
            f"node-{(i * 7 + 1) % 5_000}",
            relationships[i % 8] + f"_{i // 5_000}",
            data_ids=(f"data-{i % 50}",),
            weight=i / 4,
        )
        for i in range(10_000)
    ]

    store.upsert_nodes(scope, nodes)
    store.upsert_edges(scope, edges)

    assert store.counts(scope) == (5_000, 10_000)
    exported_nodes, exported_edges = store.export(scope)
    assert by_id(exported_nodes) == by_id(nodes)
    assert by_id(exported_edges) == by_id(edges)


def test_concurrent_upserts_of_one_node_union_every_data_id(store: GraphStore, new_scope: NewScope) -> None:
    scope = new_scope()
    store.upsert_nodes(scope, [node("a", data_ids=())])
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for round_ in range(5):
                store.upsert_nodes(scope, [node("a", data_ids=(f"d{worker}-{round_}",))])
        except BaseException as exc:  # handed to the main thread, which fails the test
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    [a] = store.get_nodes(scope, ["a"])
    assert len(a.data_ids) == 20


# The Cypher core, without a server.


def test_cypher_statements_carry_values_only_as_parameters() -> None:
    scope = Scope(tenant=HOSTILE[0], dataset=HOSTILE[1])
    nodes = [GraphNode(id=t, type=t, properties={t: t}, data_ids=[t]) for t in HOSTILE]
    edges = [GraphEdge(id=t, source_id=t, target_id=t, relationship=t, properties={t: t}) for t in HOSTILE]

    queries = [statement.query for statement, _ in upsert_node_statements(scope, nodes)]
    queries += [statement.query for statement in upsert_edge_statements(scope, edges)]

    for query in queries:
        for label in re.findall(r":`([^`]*)`", query):
            assert re.fullmatch(r"[A-Za-z0-9_]+", label)
        for text in HOSTILE:
            assert not re.search(r"['\"`]", text) or text not in query
    assert label_of("") == "_"
    assert label_of("works at ACME") == "works_at_ACME"
    assert label_of("知识") == "__"


def test_unreachable_falkordb_is_a_transient_error() -> None:
    store = FalkorGraphStore(f"redis://127.0.0.1:{free_port()}", connect_timeout_s=1.0)
    try:
        with pytest.raises(TransientStoreError):
            store.upsert_nodes(Scope(), [node("a")])
        with pytest.raises(TransientStoreError):
            store.counts(Scope())
    finally:
        store.close()


def test_unreachable_memgraph_is_a_transient_error_and_close_stops_its_loop() -> None:
    before = {thread.ident for thread in threading.enumerate()}
    store = MemgraphGraphStore(f"bolt://127.0.0.1:{free_port()}", call_timeout_s=30.0)
    try:
        with pytest.raises(TransientStoreError):
            store.upsert_nodes(Scope(), [node("a")])
    finally:
        store.close()
    left = [t for t in threading.enumerate() if t.name == "kenning-memgraph" and t.ident not in before]
    assert left == []


@pytest.mark.falkordb
def test_falkordb_labels_follow_the_node_type(falkordb_url: str, new_scope: NewScope) -> None:
    from falkordb import FalkorDB

    scope = new_scope()
    store = FalkorGraphStore(falkordb_url, graph_name="kenning_labels")
    # A pool of the test's own: FalkorDB.close() leaves the sockets of a pool it was given open.
    pool = redis.ConnectionPool.from_url(falkordb_url, decode_responses=True)
    client = FalkorDB(connection_pool=pool)
    try:
        store.upsert_nodes(scope, [node("a", "Person"), node("b", "works at")])
        store.upsert_nodes(scope, [node("a", "Organization")])
        query = "MATCH (n:Node {tenant: $tenant, dataset: $dataset}) RETURN n.id, labels(n) ORDER BY n.id"
        graph = client.select_graph(graph_key("kenning_labels", scope))
        rows = graph.ro_query(query, scope.model_dump()).result_set
        assert [(node_id, sorted(labels)) for node_id, labels in rows] == [
            ("a", ["Node", "Organization"]),
            ("b", ["Node", "works_at"]),
        ]
    finally:
        pool.disconnect()
        store.close()


def test_remove_data_deletes_what_only_it_supported_and_keeps_shared_facts(
    store: GraphStore, new_scope: NewScope
) -> None:
    # Given a shared node "s" (d1 and d2), nodes only d1 supports, and edges of each kind
    scope = new_scope()
    store.upsert_nodes(
        scope,
        [node("s", data_ids=("d1", "d2")), node("a", data_ids=("d1",)), node("b", data_ids=("d2",))],
    )
    store.upsert_edges(
        scope,
        [
            edge("s", "b", data_ids=("d1", "d2")),  # shared fact
            edge("s", "a", data_ids=("d1",)),  # only d1
            edge("b", "a", data_ids=("d2",)),  # d2's, but its endpoint "a" goes
        ],
    )

    # When d1's support is taken away
    removed = store.remove_data(scope, ["d1"])

    # Then what only d1 supported is gone, with the edge that lost its endpoint
    assert sorted(removed.deleted_nodes) == ["a"]
    assert sorted(removed.deleted_edges) == ["b-knows-a", "s-knows-a"]
    assert removed.kept == {"s": ["d2"], "s-knows-b": ["d2"]}
    nodes, edges = store.export(scope)
    assert {n.id: n.data_ids for n in nodes} == {"s": ["d2"], "b": ["d2"]}
    assert {e.id: e.data_ids for e in edges} == {"s-knows-b": ["d2"]}
    assert store.counts(scope) == (2, 1)


def test_remove_data_touches_only_its_scope(store: GraphStore, new_scope: NewScope) -> None:
    here, there = new_scope(), new_scope()
    for scope in (here, there):
        store.upsert_nodes(scope, [node("a", data_ids=("d1",))])

    assert store.remove_data(here, ["d1"]).deleted_nodes == ["a"]
    assert store.counts(here) == (0, 0)
    assert store.counts(there) == (1, 0)
    assert store.remove_data(here, ["unknown"]).deleted == []


def test_delete_elements_takes_nodes_with_their_edges(store: GraphStore, new_scope: NewScope) -> None:
    scope = new_scope()
    store.upsert_nodes(scope, [node("a"), node("b"), node("c")])
    store.upsert_edges(scope, [edge("a", "b"), edge("b", "c"), edge("a", "c")])

    store.delete_elements(scope, ["b"], ["a-knows-c", "unknown"])

    nodes, edges = store.export(scope)
    assert sorted(n.id for n in nodes) == ["a", "c"] and edges == []


def test_supported_by_lists_what_the_data_items_produced(store: GraphStore, new_scope: NewScope) -> None:
    scope = new_scope()
    store.upsert_nodes(
        scope, [node("a", data_ids=("d1",)), node("b", data_ids=("d1", "d2")), node("c", data_ids=("d2",))]
    )
    store.upsert_edges(scope, [edge("a", "b", data_ids=("d1",)), edge("b", "c", data_ids=("d2",))])

    assert store.supported_by(scope, ["d1"]) == (["a", "b"], ["a-knows-b"])
    assert store.supported_by(scope, ["d9"]) == ([], [])


def test_neighbourhood_expands_breadth_first_within_the_hops(store: GraphStore, new_scope: NewScope) -> None:
    # Given a chain a -> b -> c -> d -> e, a loop on c, and a side edge b -> x of a skipped kind
    scope = new_scope()
    store.upsert_nodes(scope, [node(i) for i in "abcdex"])
    chain = [edge("a", "b"), edge("b", "c"), edge("c", "d"), edge("d", "e"), edge("c", "c", "self")]
    store.upsert_edges(scope, [*chain, edge("b", "x", "is_a")])

    def around(ids: str, hops: int, **bounds: Any) -> list[str]:
        found = store.neighbourhood(scope, ids.split(), hops=hops, skip=["is_a"], **bounds)
        return sorted(e.id for e in found.edges)

    # Then each hop adds the edges of the nodes the previous one reached, never a skipped one
    assert around("a", 0) == []
    assert around("a", 1) == ["a-knows-b"]
    assert around("a", 2) == ["a-knows-b", "b-knows-c"]
    assert around("a", 3) == ["a-knows-b", "b-knows-c", "c-knows-d", "c-self-c"]
    assert around("a e", 1) == ["a-knows-b", "d-knows-e"]
    assert around("a", 9) == sorted(e.id for e in chain)
    assert around("nowhere", 2) == []
    assert by_id(store.neighbourhood(scope, ["d"]).edges)["c-knows-d"] == chain[2]
    # And every node the edges touch comes with its degree, skipped kinds left out, a loop once
    assert store.neighbourhood(scope, ["b"], skip=["is_a"]).degrees == {"a": 1, "b": 2, "c": 3}
    # And without a skip list the skipped kind is an edge like any other
    assert "b-is_a-x" in {e.id for e in store.neighbourhood(scope, ["x"]).edges}


def test_neighbourhood_leaves_hubs_unexpanded_and_stops_at_the_limit(
    store: GraphStore, new_scope: NewScope
) -> None:
    # Given a hub h linked to ten leaves, one of which (l0) also links to a node z
    scope = new_scope()
    leaves = [f"l{i}" for i in range(10)]
    store.upsert_nodes(scope, [node(i) for i in ["h", "z", *leaves]])
    store.upsert_edges(scope, [edge("h", leaf) for leaf in leaves] + [edge("l0", "z")])

    def around(ids: list[str], hops: int, **bounds: Any) -> list[str]:
        return sorted(e.id for e in store.neighbourhood(scope, ids, hops=hops, **bounds).edges)

    # Then a hub above max_degree brings no edges of its own, but its edges to expanded nodes come
    assert around(["h"], 2, max_degree=5) == []
    assert around(["z"], 2, max_degree=5) == ["h-knows-l0", "l0-knows-z"]
    assert around(["z"], 3, max_degree=5) == ["h-knows-l0", "l0-knows-z"]
    assert store.neighbourhood(scope, ["z"], hops=3, max_degree=5).degrees == {"z": 1, "l0": 2, "h": 10}
    assert len(around(["z"], 3, max_degree=10)) == 11
    # And the limit keeps the nodes with fewest edges first, each with all its edges or none
    assert around(["z", "h"], 1, limit=1) == ["l0-knows-z"]
    assert around(["z", "h"], 1, limit=10) == ["l0-knows-z"]
    assert len(around(["z", "h"], 1, limit=11)) == 11


def test_neighbourhood_shape_only_brings_the_same_edges_without_properties_or_provenance(
    store: GraphStore, new_scope: NewScope
) -> None:
    # Given edges with properties and several data items, one of them of a skipped kind
    scope = new_scope()
    store.upsert_nodes(scope, [node(i) for i in "abcdx"])
    edges = [
        edge("a", "b", data_ids=("d1", "d2"), weight=0.5, note="a knows b"),
        edge("b", "c", "works_with", data_ids=("d2",), since=1952),
        edge("c", "d", data_ids=("d3",)),
        edge("c", "c", "self"),
        edge("b", "x", "is_a"),
    ]
    store.upsert_edges(scope, edges)

    for ids, hops, bounds in ((["a"], 3, {}), (["d", "a"], 2, {}), (["b"], 2, {"limit": 2, "max_degree": 2})):
        full = store.neighbourhood(scope, ids, hops=hops, skip=["is_a"], **bounds)
        shape = store.neighbourhood(scope, ids, hops=hops, skip=["is_a"], shape_only=True, **bounds)
        # Then the same edges come, in the same order, with the same degrees
        assert [e.id for e in shape.edges] == [e.id for e in full.edges]
        assert shape.degrees == full.degrees
        # And each is the edge's shape: its id, endpoints and relationship alone
        stored = by_id(edges)
        for found in shape.edges:
            assert isinstance(found, EdgeShape)
            assert found == edge_shape(stored[found.id])
    # And the full edges still carry both
    full_ab = by_id(store.neighbourhood(scope, ["a"]).edges)["a-knows-b"]
    assert full_ab.properties == {"weight": 0.5, "note": "a knows b"} and full_ab.data_ids == ["d1", "d2"]


def test_edge_shapes_are_the_edges_get_edges_gives_and_follow_writes(
    store: GraphStore, new_scope: NewScope
) -> None:
    # Given edges around b, one a loop, and the scope's shape held where the store holds one
    scope = new_scope()
    store.upsert_nodes(scope, [node(i) for i in "abcde"])
    store.upsert_edges(
        scope, [edge("a", "b"), edge("b", "c", "contains", note="x"), edge("b", "b"), edge("d", "e")]
    )
    store.neighbourhood(scope, ["b"], hops=2, shape_only=True)

    def shapes(ids: list[str]) -> list[EdgeShape]:
        return sorted(store.edge_shapes(scope, ids))

    # Then edge_shapes gives get_edges' edges as shapes, each once
    for ids in (["b"], ["b", "c", "zz"], ["a", "a"], []):
        assert shapes(ids) == sorted(edge_shape(e) for e in store.get_edges(scope, ids))
    assert [e.id for e in shapes(["c", "b"])] == ["a-knows-b", "b-contains-c", "b-knows-b"]
    # And a write shows at once
    store.upsert_nodes(scope, [node("f")])
    store.upsert_edges(scope, [edge("b", "f", "likes")])
    store.delete_elements(scope, [], ["a-knows-b"])
    assert [e.id for e in shapes(["b"])] == ["b-contains-c", "b-knows-b", "b-likes-f"]


def test_neighbourhood_shapes_follow_every_write(store: GraphStore, new_scope: NewScope) -> None:
    # Given a chain a - b - c whose shape was asked for once
    scope = new_scope()
    store.upsert_nodes(scope, [node("a", data_ids=("d1",)), node("b"), node("c", data_ids=("d2",))])
    store.upsert_edges(scope, [edge("a", "b"), edge("b", "c", data_ids=("d2",))])

    def shape_ids() -> list[str]:
        return sorted(e.id for e in store.neighbourhood(scope, ["b"], hops=2, shape_only=True).edges)

    assert shape_ids() == ["a-knows-b", "b-knows-c"]
    # When an edge is added, then a data item forgotten, then an element deleted
    store.upsert_nodes(scope, [node("e")])
    store.upsert_edges(scope, [edge("b", "e")])
    after_upsert = shape_ids()
    store.remove_data(scope, ["d2"])
    after_removal = shape_ids()
    store.delete_elements(scope, [], ["a-knows-b"])
    # Then each shape asked for next shows it at once
    assert after_upsert == ["a-knows-b", "b-knows-c", "b-knows-e"]
    assert after_removal == ["a-knows-b", "b-knows-e"]
    assert shape_ids() == ["b-knows-e"]
