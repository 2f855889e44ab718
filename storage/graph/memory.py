"""The in-memory graph store: the twin every graph adapter is measured against, under the same
batch rules (`kenning.storage.graph.rules`)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from kenning.pipeline.assembly import over_edge
from kenning.pipeline.models import EdgeShape, GraphEdge, GraphNode, Removal, Scope
from kenning.pipeline.ports import Neighbourhood
from kenning.storage.graph.rules import (
    Element,
    by_first_end,
    copy_properties,
    edge_shape,
    expand,
    over_node,
    removal,
    take_support,
    unique_edges,
    unique_nodes,
)


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
