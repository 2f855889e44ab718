"""A scope's graph shape held in memory: every edge's id, endpoints and relationship.

`neighbourhood(shape_only=True)`, the walk's subgraph (`GRAPH_PPR`), needs only this: node
degrees and the edges touching a frontier, hop after hop. On the SQL graph each hop is two
SQL queries per 500 nodes (about 100 ms a question on 6,119 paragraphs); from a `Shape` it is
dictionary look-ups. Used only at the revision it was read at (`storage.snapshots`).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kenning.pipeline.models import GraphEdge
from kenning.storage.memory_graph import shape

# Edges held by all the shapes of one graph store at most (about 300 bytes each).
MAX_EDGES = 500_000
# Edges a shape keeps built as `GraphEdge`s for the walks after (about 600 bytes each): a walk
# reads thousands, hubs' edges in most walks.
MAX_BUILT = 50_000

Row = tuple[str, str, str, str]  # id, source, target, relationship


@dataclass(frozen=True)
class Shape:
    """Immutable at its revision, so what it works out once (degrees, edges built) it keeps.
    The `GraphEdge`s it returns are shared by the walks that read them: read them, never change them."""

    revision: int
    edges: list[Row]
    touching: dict[str, list[int]]  # node -> the edges with an end there (a loop once)
    _degrees: dict[frozenset[str], dict[str, int]] = field(default_factory=dict, compare=False, repr=False)
    _built: dict[int, GraphEdge] = field(default_factory=dict, compare=False, repr=False)

    @property
    def size(self) -> int:
        """Edges held."""
        return len(self.edges)

    @classmethod
    def read(cls, revision: int, rows: Iterable[Row]) -> Shape:
        # Node ids recur across edges: one string each.
        edges = [
            (edge_id, sys.intern(source), sys.intern(target), sys.intern(kind))
            for edge_id, source, target, kind in rows
        ]
        touching: dict[str, list[int]] = {}
        for index, (_, source, target, _) in enumerate(edges):
            touching.setdefault(source, []).append(index)
            if target != source:
                touching.setdefault(target, []).append(index)
        return cls(revision, edges, touching)

    def degrees(self, node_ids: Sequence[str], skip: frozenset[str]) -> dict[str, int]:
        """Each node's edges not of a skipped relationship; nodes with none are left out."""
        known = self._degrees.setdefault(skip, {})
        counts: dict[str, int] = {}
        for node in node_ids:
            count = known.get(node)
            if count is None:
                count = sum(1 for index in self.touching.get(node, ()) if self.edges[index][3] not in skip)
                known[node] = count
            if count:
                counts[node] = count
        return counts

    def edges_of(self, node_ids: Sequence[str], skip: frozenset[str]) -> list[GraphEdge]:
        """The edges (shapes only) with an end among the nodes, not of a skipped relationship."""
        found: dict[int, None] = {}
        for node in node_ids:
            for index in self.touching.get(node, ()):
                if self.edges[index][3] not in skip:
                    found[index] = None
        return [self._edge(index) for index in found]

    def _edge(self, index: int) -> GraphEdge:
        built = self._built.get(index)
        if built is None:
            built = shape(*self.edges[index])
            if len(self._built) < MAX_BUILT:
                self._built[index] = built
        return built
