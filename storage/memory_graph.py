"""The in-memory graph store: the twin every graph adapter is measured against.

It also holds the batch rules the other graph adapters share, so that every
adapter treats duplicates in one call the same way.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kenning.pipeline.assembly import edge_prevails, node_prevails
from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import EdgeShape, GraphEdge, GraphNode, Removal, Scope
from kenning.pipeline.ports import Neighbourhood

NODE_SETS = "node_sets"
Element = TypeVar("Element", GraphNode, GraphEdge)


def union(*groups: Iterable[str]) -> list[str]:
    """The distinct data ids of all groups, sorted: the order every graph store returns."""
    return sorted({data_id for group in groups for data_id in group})


def unique_nodes(nodes: Sequence[GraphNode]) -> list[GraphNode]:
    """One node per id: the last one given wins unless an earlier one prevails
    (`pipeline.assembly.node_prevails`); the data ids of all are unioned."""
    merged: dict[str, GraphNode] = {}
    for node in nodes:
        earlier = merged.get(node.id)
        merged[node.id] = over_node(node, earlier) if earlier else _sorted_ids(node)
    return list(merged.values())


def unique_edges(edges: Sequence[GraphEdge]) -> list[GraphEdge]:
    """One edge per id: the last one given wins unless an earlier one prevails
    (`pipeline.assembly.edge_prevails`); the data ids of all are unioned."""
    merged: dict[str, GraphEdge] = {}
    for edge in edges:
        earlier = merged.get(edge.id)
        merged[edge.id] = over_edge(edge, earlier) if earlier else _sorted_ids(edge)
    return list(merged.values())


def _sorted_ids(item: Element) -> Element:
    data_ids = union(item.data_ids)
    return item if data_ids == item.data_ids else item.model_copy(update={"data_ids": data_ids})


def over_node(node: GraphNode, stored: GraphNode) -> GraphNode:
    """The node to write over `stored`: its data ids unioned, its node sets too, and the type and
    properties of whichever of the two prevails. So they do not depend on the order of writes."""
    winner = node if node_prevails(node.properties, stored.properties) else stored
    properties = dict(winner.properties)
    sets = (node.properties.get(NODE_SETS), stored.properties.get(NODE_SETS))
    if all(isinstance(value, list) for value in sets):
        properties[NODE_SETS] = union(*(value for value in sets if isinstance(value, list)))
    data_ids = union(stored.data_ids, node.data_ids)
    return node.model_copy(update={"type": winner.type, "properties": properties, "data_ids": data_ids})


def over_edge(edge: GraphEdge, stored: GraphEdge) -> GraphEdge:
    """The edge to write over `stored`: its data ids unioned, the properties of the one that prevails."""
    winner = edge if edge_prevails(edge.properties, stored.properties) else stored
    data_ids = union(stored.data_ids, edge.data_ids)
    return edge.model_copy(update={"properties": dict(winner.properties), "data_ids": data_ids})


def over_stored_nodes(nodes: Sequence[GraphNode], stored: Iterable[GraphNode]) -> list[GraphNode]:
    """Each node as `over_node` writes it over its stored self, if any."""
    earlier = {node.id: node for node in stored}
    return [over_node(node, earlier[node.id]) if node.id in earlier else node for node in nodes]


def over_stored_edges(edges: Sequence[GraphEdge], stored: Iterable[GraphEdge]) -> list[GraphEdge]:
    """Each edge as `over_edge` writes it over its stored self, if any."""
    earlier = {edge.id: edge for edge in stored}
    return [over_edge(edge, earlier[edge.id]) if edge.id in earlier else edge for edge in edges]


def copy_properties(properties: dict[str, Any]) -> dict[str, Any]:
    """A detached copy of JSON-serializable properties, as a real store would give back."""
    try:
        copied: dict[str, Any] = json.loads(json.dumps(properties))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"graph properties must be JSON-serializable: {exc}") from exc
    return copied


def take_support(
    owners: Mapping[str, Sequence[str]], gone: set[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """(ids left with no data item, {id: remaining data ids} of the others that lost some)."""
    deleted: list[str] = []
    kept: dict[str, list[str]] = {}
    for owner, data_ids in owners.items():
        left = [data_id for data_id in data_ids if data_id not in gone]
        if len(left) == len(data_ids):
            continue
        if left:
            kept[owner] = left
        else:
            deleted.append(owner)
    return deleted, kept


def removal(
    nodes: tuple[list[str], dict[str, list[str]]],
    edges: tuple[list[str], dict[str, list[str]]],
    dangling: Iterable[str],
) -> Removal:
    """The Removal from `take_support` over nodes and edges, plus the edges that lost an endpoint."""
    deleted_edges = list(dict.fromkeys([*edges[0], *dangling]))
    dead = set(deleted_edges)
    kept = {**nodes[1], **{edge_id: ids for edge_id, ids in edges[1].items() if edge_id not in dead}}
    return Removal(deleted_nodes=nodes[0], deleted_edges=deleted_edges, kept=kept)


Ends = TypeVar("Ends", GraphEdge, EdgeShape)


def expand(
    degrees: Callable[[list[str]], dict[str, int]],
    owned_by: Callable[[list[str]], dict[str, list[Ends]]],
    node_ids: Sequence[str],
    hops: int,
    limit: int,
    max_degree: int,
) -> Neighbourhood:
    """The breadth-first neighbourhood every graph adapter returns (see GraphStore.neighbourhood).

    `degrees(ids)` counts each node's edges and `owned_by(ids)` returns the edges touching any
    of them, each under the first of its ends among the ids, in id order (`by_first_end` makes
    it from a read of the edges), both leaving out the skipped relationships: the adapter
    pushes those into its store.
    """
    found: dict[str, Ends] = {}
    counts: dict[str, int] = {}
    seen = set(node_ids)
    frontier = sorted(seen)
    for _ in range(max(hops, 0)):
        counts.update(degrees(frontier) if frontier else {})
        opened = sorted(
            (node for node in frontier if 0 < counts.get(node, 0) <= max_degree),
            key=lambda node: (counts[node], node),
        )
        if not opened:
            break
        owned = owned_by(opened)
        reached: set[str] = set()
        for node in opened:
            new = [edge for edge in owned.get(node, []) if edge.id not in found]
            if len(found) + len(new) > limit:
                return _with_degrees(found, counts, seen, degrees)
            for edge in new:
                found[edge.id] = edge
                reached.update((edge.source_id, edge.target_id))
        frontier = sorted(reached - seen)
        seen.update(frontier)
    return _with_degrees(found, counts, seen, degrees)


def _with_degrees(
    found: dict[str, Ends],
    counts: dict[str, int],
    seen: set[str],
    degrees: Callable[[list[str]], dict[str, int]],
) -> Neighbourhood:
    ends = {end for edge in found.values() for end in (edge.source_id, edge.target_id)}
    missing = sorted(ends - set(counts))
    counts.update(degrees(missing) if missing else {})
    known = {node: count for node, count in counts.items() if count and (node in ends or node in seen)}
    return Neighbourhood(edges=list(found.values()), degrees=known)


def edge_shape(edge: GraphEdge) -> EdgeShape:
    """The edge's id, endpoints and relationship alone: what `neighbourhood(shape_only=True)` returns."""
    return EdgeShape(edge.id, edge.source_id, edge.target_id, edge.relationship)


def by_first_end(
    edges_of: Callable[[list[str]], Sequence[Ends]],
) -> Callable[[list[str]], dict[str, list[Ends]]]:
    """`expand`'s `owned_by` from `edges_of(ids)`, the edges touching any of the ids."""
    return lambda nodes: _edges_by_node(edges_of(nodes), nodes)


def _edges_by_node(edges: Iterable[Ends], nodes: Sequence[str]) -> dict[str, list[Ends]]:
    """Each edge under the first of its endpoints among `nodes`, edges in id order."""
    order = {node: index for index, node in enumerate(nodes)}
    owned: dict[str, list[Ends]] = {}
    for edge in sorted(edges, key=lambda edge: edge.id):
        ends = [end for end in (edge.source_id, edge.target_id) if end in order]
        if ends:
            owned.setdefault(min(ends, key=order.__getitem__), []).append(edge)
    return owned


@dataclass
class _Graph:
    nodes: dict[str, GraphNode] = field(default_factory=dict)
    edges: dict[str, GraphEdge] = field(default_factory=dict)


class MemoryGraphStore:
    """A GraphStore held in process memory; thread-safe, lost on exit."""

    def __init__(self) -> None:
        # Keyed by the Scope itself: "a/b" + "c" and "a" + "b/c" are different scopes.
        self._graphs: dict[Scope, _Graph] = {}
        self._lock = threading.Lock()

    def upsert_nodes(self, scope: Scope, nodes: Sequence[GraphNode]) -> None:
        stored = [_stored_node(node) for node in unique_nodes(nodes)]
        with self._lock:
            graph = self._graphs.setdefault(scope, _Graph())
            for node in stored:
                earlier = graph.nodes.get(node.id)
                graph.nodes[node.id] = over_node(node, earlier) if earlier else node

    def upsert_edges(self, scope: Scope, edges: Sequence[GraphEdge]) -> None:
        stored = [_stored_edge(edge) for edge in unique_edges(edges)]
        with self._lock:
            graph = self._graphs.setdefault(scope, _Graph())
            for edge in stored:
                if edge.source_id not in graph.nodes or edge.target_id not in graph.nodes:
                    continue
                earlier = graph.edges.get(edge.id)
                graph.edges[edge.id] = over_edge(edge, earlier) if earlier else edge

    def get_nodes(self, scope: Scope, node_ids: Sequence[str], *, provenance: bool = True) -> list[GraphNode]:
        with self._lock:
            nodes = self._graph(scope).nodes
            found = [nodes[node_id] for node_id in dict.fromkeys(node_ids) if node_id in nodes]
            return [_copied(node, provenance) for node in found]

    def get_edges(
        self, scope: Scope, node_ids: Sequence[str], among: bool = False, *, provenance: bool = True
    ) -> list[GraphEdge]:
        wanted = set(node_ids)
        with self._lock:
            edges = self._graph(scope).edges.values()
            return [
                _copied(edge, provenance)
                for edge in edges
                if (edge.source_id in wanted and edge.target_id in wanted)
                or (not among and (edge.source_id in wanted or edge.target_id in wanted))
            ]

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
        skipped = set(skip)

        def followed(ids: list[str]) -> list[GraphEdge]:
            wanted = set(ids)
            with self._lock:
                edges = self._graph(scope).edges.values()
                return [
                    edge
                    for edge in edges
                    if edge.relationship not in skipped and {edge.source_id, edge.target_id} & wanted
                ]

        def touching(ids: list[str]) -> list[GraphEdge]:
            return [_edge_copy(edge) for edge in followed(ids)]

        def shapes(ids: list[str]) -> list[EdgeShape]:
            return [edge_shape(edge) for edge in followed(ids)]

        def degrees(ids: list[str]) -> dict[str, int]:
            counts: dict[str, int] = {}
            wanted = set(ids)
            for edge in followed(ids):
                for end in {edge.source_id, edge.target_id} & wanted:
                    counts[end] = counts.get(end, 0) + 1
            return counts

        if shape_only:
            return expand(degrees, by_first_end(shapes), node_ids, hops, limit, max_degree)
        return expand(degrees, by_first_end(touching), node_ids, hops, limit, max_degree)

    def remove_data(self, scope: Scope, data_ids: Sequence[str]) -> Removal:
        gone = set(data_ids)
        with self._lock:
            graph = self._graph(scope)
            nodes = take_support({node.id: node.data_ids for node in graph.nodes.values()}, gone)
            edges = take_support({edge.id: edge.data_ids for edge in graph.edges.values()}, gone)
            dead = set(nodes[0])
            dangling = [e.id for e in graph.edges.values() if e.source_id in dead or e.target_id in dead]
            result = removal(nodes, edges, dangling)
            for node_id in result.deleted_nodes:
                del graph.nodes[node_id]
            for edge_id in result.deleted_edges:
                del graph.edges[edge_id]
            for item_id, left in result.kept.items():
                (graph.nodes.get(item_id) or graph.edges[item_id]).data_ids = left
        return result

    def supported_by(self, scope: Scope, data_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        wanted = set(data_ids)
        with self._lock:
            graph = self._graph(scope)
            nodes = sorted(n.id for n in graph.nodes.values() if wanted.intersection(n.data_ids))
            edges = sorted(e.id for e in graph.edges.values() if wanted.intersection(e.data_ids))
        return nodes, edges

    def delete_elements(self, scope: Scope, node_ids: Sequence[str], edge_ids: Sequence[str]) -> None:
        nodes, edges = set(node_ids), set(edge_ids)
        with self._lock:
            graph = self._graph(scope)
            for edge in list(graph.edges.values()):
                if edge.id in edges or edge.source_id in nodes or edge.target_id in nodes:
                    del graph.edges[edge.id]
            for node_id in nodes:
                graph.nodes.pop(node_id, None)

    def export(self, scope: Scope) -> tuple[list[GraphNode], list[GraphEdge]]:
        with self._lock:
            graph = self._graph(scope)
            nodes = [node.model_copy(deep=True) for node in graph.nodes.values()]
            edges = [edge.model_copy(deep=True) for edge in graph.edges.values()]
            return nodes, edges

    def counts(self, scope: Scope) -> tuple[int, int]:
        with self._lock:
            graph = self._graph(scope)
            return len(graph.nodes), len(graph.edges)

    def close(self) -> None:
        with self._lock:
            self._graphs.clear()

    def _graph(self, scope: Scope) -> _Graph:
        return self._graphs.get(scope) or _Graph()


def _edge_copy(edge: GraphEdge) -> GraphEdge:
    return edge.model_copy(deep=True)


def _stored_node(node: GraphNode) -> GraphNode:
    return node.model_copy(update={"properties": copy_properties(node.properties)}, deep=True)


def _stored_edge(edge: GraphEdge) -> GraphEdge:
    return edge.model_copy(update={"properties": copy_properties(edge.properties)}, deep=True)


def _copied(element: Element, provenance: bool) -> Element:
    """A deep copy for a caller to keep; without `provenance`, with no `data_ids`."""
    copy = element.model_copy(deep=True)
    if not provenance:
        copy.data_ids = []
    return copy
