"""Facts as of a moment: the ports every retriever reads through, showing only the facts that hold
now (by default) or held at `as_of` (`kenning.pipeline.validity`). Nodes, chunks and walks over the
graph's shape are left as they are: a retired fact is history, not a wrong path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kenning.pipeline.collection import FACTS
from kenning.pipeline.lexical import LexicalIndex
from kenning.pipeline.models import EdgeShape, GraphEdge, GraphNode, Removal, Scope, ScoredPoint, VectorPoint
from kenning.pipeline.ports import Completer, Embedder, GraphStore, Neighbourhood, VectorStore
from kenning.pipeline.validity import PERIODS, holds
from kenning.retrieval.contract import SearchPorts

# A search of facts asks for `limit`, then for more while retired ones took places in it.
_WIDER = (1, 4, 16)


class TimeView:
    """The search ports with the facts of `as_of` (None: those that hold now)."""

    def __init__(self, ports: SearchPorts, as_of: str | None = None) -> None:
        self._ports = ports
        self._graph = FactsAt(ports.graph, as_of)
        self._vectors = PointsAt(ports.vectors, as_of)

    @property
    def vectors(self) -> VectorStore:
        return self._vectors

    @property
    def lexical(self) -> LexicalIndex:
        return self._ports.lexical

    @property
    def graph(self) -> GraphStore:
        return self._graph

    @property
    def embedder(self) -> Embedder:
        return self._ports.embedder

    @property
    def completer(self) -> Completer:
        return self._ports.completer


class FactsAt:
    """A GraphStore that reads the facts holding at one moment; writes go through unchanged."""

    def __init__(self, inner: GraphStore, as_of: str | None) -> None:
        self._inner = inner
        self._as_of = as_of

    def __getattr__(self, name: str) -> Any:
        # What the port does not name (a Cypher reader's queries) is the store's own, unfiltered.
        return getattr(self._inner, name)

    def _held(self, edges: Sequence[GraphEdge]) -> list[GraphEdge]:
        return [edge for edge in edges if holds(edge.properties, self._as_of)]

    def upsert_nodes(self, scope: Scope, nodes: Sequence[GraphNode]) -> None:
        self._inner.upsert_nodes(scope, nodes)

    def upsert_edges(self, scope: Scope, edges: Sequence[GraphEdge]) -> None:
        self._inner.upsert_edges(scope, edges)

    def get_nodes(self, scope: Scope, node_ids: Sequence[str], *, provenance: bool = True) -> list[GraphNode]:
        return self._inner.get_nodes(scope, node_ids, provenance=provenance)

    def get_edges(
        self, scope: Scope, node_ids: Sequence[str], among: bool = False, *, provenance: bool = True
    ) -> list[GraphEdge]:
        return self._held(self._inner.get_edges(scope, node_ids, among=among, provenance=provenance))

    def edge_shapes(self, scope: Scope, node_ids: Sequence[str]) -> list[EdgeShape]:
        return self._inner.edge_shapes(scope, node_ids)

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
        found = self._inner.neighbourhood(
            scope, node_ids, hops=hops, limit=limit, max_degree=max_degree, skip=skip, shape_only=shape_only
        )
        if shape_only:
            return found
        edges = [e for e in found.edges if not isinstance(e, GraphEdge) or holds(e.properties, self._as_of)]
        return Neighbourhood(edges=edges, degrees=found.degrees)

    def export(self, scope: Scope) -> tuple[list[GraphNode], list[GraphEdge]]:
        nodes, edges = self._inner.export(scope)
        return nodes, self._held(edges)

    def remove_data(self, scope: Scope, data_ids: Sequence[str]) -> Removal:
        return self._inner.remove_data(scope, data_ids)

    def supported_by(self, scope: Scope, data_ids: Sequence[str]) -> tuple[list[str], list[str]]:
        return self._inner.supported_by(scope, data_ids)

    def delete_elements(self, scope: Scope, node_ids: Sequence[str], edge_ids: Sequence[str]) -> None:
        self._inner.delete_elements(scope, node_ids, edge_ids)

    def counts(self, scope: Scope) -> tuple[int, int]:
        return self._inner.counts(scope)

    def close(self) -> None:
        self._inner.close()


def every_fact(graph: GraphStore) -> GraphStore:
    """The store under a view of the facts at a moment: every fact, retired ones too (the store
    itself when it is no such view). A view may be of another: AUTO's searches read through both."""
    while isinstance(graph, FactsAt):
        graph = graph._inner
    return graph


class PointsAt:
    """A VectorStore whose fact collections give the facts holding at one moment."""

    def __init__(self, inner: VectorStore, as_of: str | None) -> None:
        self._inner = inner
        self._as_of = as_of

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def ensure_collection(self, name: str, dimension: int) -> None:
        self._inner.ensure_collection(name, dimension)

    def upsert(self, scope: Scope, collection: str, points: Sequence[VectorPoint]) -> None:
        self._inner.upsert(scope, collection, points)

    def search(
        self,
        scope: Scope,
        collection: str,
        vector: Sequence[float],
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredPoint]:
        if collection not in FACTS:
            return self._inner.search(scope, collection, vector, limit, fields)
        wanted = None if fields is None else [*fields, PERIODS]
        held: list[ScoredPoint] = []
        for times in _WIDER:
            found = self._inner.search(scope, collection, vector, limit * times, wanted)
            held = [point for point in found if holds(point.payload, self._as_of)]
            if len(held) >= limit or len(found) < limit * times:
                break
        return held[:limit]

    def retrieve(
        self, scope: Scope, collection: str, ids: Sequence[str], fields: Sequence[str] | None = None
    ) -> list[VectorPoint]:
        if collection not in FACTS:
            return self._inner.retrieve(scope, collection, ids, fields)
        wanted = None if fields is None else [*fields, PERIODS]
        found = self._inner.retrieve(scope, collection, ids, wanted)
        return [point for point in found if holds(point.payload, self._as_of)]

    def delete(self, scope: Scope, collection: str, ids: Sequence[str]) -> None:
        self._inner.delete(scope, collection, ids)

    def set_payload(self, scope: Scope, collection: str, values: dict[str, dict[str, Any]]) -> None:
        self._inner.set_payload(scope, collection, values)

    def list_collections(self) -> list[str]:
        return self._inner.list_collections()

    def count(self, scope: Scope, collection: str) -> int:
        return self._inner.count(scope, collection)

    def close(self) -> None:
        self._inner.close()
