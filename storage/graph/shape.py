"""A scope's graph shape held in memory: every edge's id, endpoints and relationship.

`neighbourhood(shape_only=True)`, the walk's subgraph (`GRAPH_PPR`), needs only this: node
degrees and the edges touching a frontier, hop after hop. On the SQL graph each hop is two
SQL queries per 500 nodes (about 100 ms a question on 6,119 paragraphs); from a `Shape` it is
dictionary look-ups. `edge_shapes` (GRAPH_COMPLETION's chunks' `contains` edges) reads it too.
Used only at the revision it was read at (`kenning.storage.sql.snapshots`).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kenning.pipeline.models import EdgeShape
from kenning.pipeline.ports import Neighbourhood

# Edges held by all the shapes of one graph store at most (about 300 bytes each).
MAX_EDGES = 500_000

Row = tuple[str, str, str, str]  # id, source, target, relationship


@dataclass(frozen=True)
class Shape:
    """Immutable at its revision, so what it works out once it keeps, per skip set asked (the
    walk asks one): the positions of a node's edges that the skip set leaves (at most `touching`
    again), and every node's degree (a dict of 64,000 nodes on the full 2Wiki store, about 2 MB,
    that the store's edge budget does not count). It holds plain tuples, which the garbage
    collector stops tracking: when it kept 50,000 edges built as `GraphEdge`s, every full
    collection went over them (100 ms and more on the full 2Wiki store). The `EdgeShape`s it
    returns are made per read, a fraction of a microsecond each."""

    revision: int
    edges: list[Row]
    touching: dict[str, tuple[int, ...]]  # node -> the edges with an end there (a loop once), in id order
    _kept: dict[frozenset[str], dict[str, tuple[int, ...]]] = field(
        default_factory=dict, compare=False, repr=False
    )
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

    def touching_edges(self, node_ids: Sequence[str]) -> list[EdgeShape]:
        """The edges with an end among the nodes, each once."""
        positions = dict.fromkeys(i for node in node_ids for i in self.touching.get(node, ()))
        return self._shapes(positions)

    def _shapes(self, positions: Iterable[int]) -> list[EdgeShape]:
        rows = self.edges
        return [_edge_shape(EdgeShape, rows[i]) for i in positions]

    def neighbourhood(
        self, node_ids: Sequence[str], hops: int, limit: int, max_degree: int, skip: frozenset[str]
    ) -> Neighbourhood:
        """`memory_graph.expand` over this shape, on edge positions: the same edges in the same
        order and the same degrees, with no edge made before it is kept."""
        kept = self._kept.setdefault(skip, {})
        degrees = self.degrees(skip)

        def edges_of(node: str) -> tuple[int, ...]:
            found = kept.get(node)
            if found is None:
                found = tuple(i for i in self.touching.get(node, ()) if self.edges[i][3] not in skip)
                kept[node] = found
            return found

        counts: dict[str, int] = {}
        found: dict[int, None] = {}
        seen = set(node_ids)
        frontier = sorted(seen)
        for _ in range(max(hops, 0)):
            _count(counts, frontier, degrees)
            opened = sorted(
                (node for node in frontier if 0 < counts.get(node, 0) <= max_degree),
                key=lambda node: (counts[node], node),
            )
            if not opened:
                break
            new = self._open(opened, edges_of, found, limit)
            if new is None:
                break
            frontier = sorted(self._ends(new) - seen)
            seen.update(frontier)
        ends = self._ends(found)
        _count(counts, sorted(ends - set(counts)), degrees)
        known = {node: count for node, count in counts.items() if count and (node in ends or node in seen)}
        return Neighbourhood(edges=self._shapes(found), degrees=known)

    def degrees(self, skip: frozenset[str]) -> dict[str, int]:
        """Each node's number of edges of a relationship not in `skip`, nodes with none left out:
        worked out once per skip set (76 ms for the 183,000 edges of the full 2Wiki store), where
        counting a node's kept edges each time it was reached took a sixth of a neighbourhood."""
        found = self._degrees.get(skip)
        if found is None:
            ends = (
                end
                for _, source, target, kind in self.edges
                if kind not in skip
                for end in ((source,) if source == target else (source, target))
            )
            found = self._degrees[skip] = dict(Counter(ends))
        return found

    def _ends(self, positions: Iterable[int]) -> set[str]:
        rows = [self.edges[i] for i in positions]
        return {row[1] for row in rows} | {row[2] for row in rows}

    @staticmethod
    def _open(
        opened: list[str], edges_of: Callable[[str], tuple[int, ...]], found: dict[int, None], limit: int
    ) -> list[int] | None:
        """Add to `found` the edges of each opened node in turn (an edge of two opened nodes goes
        with the first), and return them; None, adding nothing more, at the first node whose edges
        would pass `limit`."""
        added: list[int] = []
        for node in opened:
            new = [i for i in edges_of(node) if i not in found]
            if len(found) + len(new) > limit:
                return None
            found.update(dict.fromkeys(new))
            added += new
        return added


# A row made an `EdgeShape` without `EdgeShape._make`'s frame and length check: rows are ours.
_edge_shape = tuple.__new__


def _count(counts: dict[str, int], nodes: Iterable[str], degrees: dict[str, int]) -> None:
    """Add to `counts` the degree of each node that has any edge, in the nodes' order."""
    for node in nodes:
        if degree := degrees.get(node, 0):
            counts[node] = degree
