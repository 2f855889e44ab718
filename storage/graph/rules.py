"""The batch rules every graph store follows: duplicates in one call merged one way, data ids
unioned, support taken away on forget, and the breadth-first neighbourhood. The in-memory twin
and the real adapters all import them from here."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from kenning.pipeline.assembly import node_prevails, over_edge
from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import EdgeShape, GraphEdge, GraphNode, Removal
from kenning.pipeline.ports import Neighbourhood

NODE_SETS = "node_sets"
Element = TypeVar("Element", GraphNode, GraphEdge)


def union(*groups: Iterable[str]) -> list[str]:
    """The distinct data ids of all groups, sorted: the order every graph store returns."""
    return sorted({data_id for group in groups for data_id in group})


def unique_nodes(nodes: Sequence[GraphNode]) -> list[GraphNode]:
    """One node per id: the last one given wins unless an earlier one prevails
    (`kenning.pipeline.assembly.node_prevails`); the data ids of all are unioned."""
    merged: dict[str, GraphNode] = {}
    for node in nodes:
        earlier = merged.get(node.id)
        merged[node.id] = over_node(node, earlier) if earlier else _sorted_ids(node)
    return list(merged.values())


def unique_edges(edges: Sequence[GraphEdge]) -> list[GraphEdge]:
    """One edge per id: the last one given wins unless an earlier one prevails
    (`kenning.pipeline.assembly.edge_prevails`); the data ids of all are unioned."""
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
