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

from kenning.pipeline.models import EdgeShape

# Edges held by all the shapes of one graph store at most (about 300 bytes each).
MAX_EDGES = 500_000

Row = tuple[str, str, str, str]  # id, source, target, relationship


@dataclass(frozen=True)
class Shape:
    """Immutable at its revision, so what it works out once (degrees) it keeps. It holds plain
    tuples, which the garbage collector stops tracking: when it kept 50,000 edges built as
    `GraphEdge`s, every full collection went over them (100 ms and more on the full 2Wiki
    store). The `EdgeShape`s it returns are made per read, a fraction of a microsecond each."""

    revision: int
    edges: list[Row]
    touching: dict[str, tuple[int, ...]]  # node -> the edges with an end there (a loop once), in id order
    _degrees: dict[frozenset[str], dict[str, int]] = field(default_factory=dict, compare=False, repr=False)

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
        # As tuples of ints in edge id order, which the collector stops tracking, as it does the rows.
        return cls(
            revision,
            edges,
            {
                node: tuple(sorted(indexes, key=lambda index: edges[index][0]))
                for node, indexes in touching.items()
            },
        )

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

    def edges_by_node(self, node_ids: Sequence[str], skip: frozenset[str]) -> dict[str, list[EdgeShape]]:
        """The edges with an end among the nodes, not of a skipped relationship, each under the
        first of its ends in `node_ids`, in id order (as `memory_graph.by_first_end` groups them)."""
        taken: set[int] = set()
        owned: dict[str, list[EdgeShape]] = {}
        for node in node_ids:
            mine = [
                index
                for index in self.touching.get(node, ())
                if index not in taken and self.edges[index][3] not in skip
            ]
            if mine:
                taken.update(mine)
                owned[node] = [EdgeShape._make(self.edges[index]) for index in mine]
        return owned
