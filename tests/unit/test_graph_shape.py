"""A graph shape held in memory: the walk's neighbourhood, as `expand` gives it over the same edges."""

from __future__ import annotations

import functools
import gc
import random

from kenning.pipeline.models import EdgeShape
from kenning.storage.graph.rules import by_first_end, expand
from kenning.storage.graph.shape import Row, Shape

ROWS = [
    ("e1", "a", "b", "contains"),
    ("e2", "a", "c", "next"),
    ("e3", "b", "c", "contains"),
    ("e4", "a", "a", "contains"),
]


def test_degrees_follow_the_skip_set_asked_each_time() -> None:
    shape = Shape.read(1, ROWS)

    assert shape.neighbourhood(["a", "z"], 1, 100, 100, frozenset()).degrees == {"a": 3, "b": 2, "c": 2}
    assert shape.neighbourhood(["a"], 1, 100, 100, frozenset({"next"})).degrees == {"a": 2, "b": 2}
    assert shape.neighbourhood(["c"], 1, 100, 100, frozenset({"next", "contains"})).degrees == {}
    # asked again, from what was kept: the same answers
    assert shape.neighbourhood(["a"], 1, 100, 100, frozenset()).degrees == {"a": 3, "b": 2, "c": 2}
    assert shape.neighbourhood(["a"], 1, 100, 100, frozenset({"next"})).degrees == {"a": 2, "b": 2}


def test_edges_come_as_shapes_and_the_collector_tracks_nothing_the_shape_holds() -> None:
    shape = Shape.read(1, ROWS)

    first = shape.neighbourhood(["a"], 1, 100, 100, frozenset({"next"})).edges
    again = shape.neighbourhood(["a", "b"], 1, 100, 100, frozenset()).edges

    assert sorted(e.id for e in first) == ["e1", "e4"]
    assert sorted(e.id for e in again) == ["e1", "e2", "e3", "e4"]
    assert {e.id: e for e in again}["e2"] == EdgeShape("e2", "a", "c", "next")
    assert all(isinstance(edge, EdgeShape) for edge in [*first, *again])
    # Once a collection has gone over them, nothing the shape holds is tracked: a large graph
    # held in memory adds nothing to later full collections.
    gc.collect()
    assert not any(gc.is_tracked(row) for row in shape.edges)
    assert not any(gc.is_tracked(indexes) for indexes in shape.touching.values())
    assert not any(gc.is_tracked(kept) for per_skip in shape._kept.values() for kept in per_skip.values())
    assert shape._degrees and not any(gc.is_tracked(degrees) for degrees in shape._degrees.values())


def test_neighbourhood_is_what_expand_gives_over_the_same_edges() -> None:
    """The same edges in the same order and the same degrees as `expand` over a read of the rows,
    on random graphs, seeds, hops, bounds and skip sets, the edge limit reached or not."""
    chance = random.Random(11)
    nodes = [f"n{n}" for n in range(40)]
    kinds = ["contains", "next", "knows"]
    limited = 0
    for _ in range(80):
        rows = [
            (
                f"e{chance.randrange(10**6):06d}",
                chance.choice(nodes),
                chance.choice(nodes),
                chance.choice(kinds),
            )
            for _ in range(chance.randint(0, 150))
        ]
        rows = list({row[0]: row for row in rows}.values())
        skip = frozenset(chance.sample(kinds, chance.randint(0, 2)))
        seeds = chance.sample(nodes, chance.randint(0, 4))
        hops, limit, max_degree = chance.randint(0, 3), chance.randint(1, 120), chance.randint(1, 12)
        kept = [row for row in rows if row[3] not in skip]
        expected = expand(
            functools.partial(_degrees, kept),
            by_first_end(functools.partial(_touching, kept)),
            seeds,
            hops,
            limit,
            max_degree,
        )
        found = Shape.read(1, rows).neighbourhood(seeds, hops, limit, max_degree, skip)
        assert found.edges == expected.edges
        assert list(found.degrees.items()) == list(expected.degrees.items())
        limited += len(found.edges) < len(
            Shape.read(1, kept).neighbourhood(seeds, hops, 10**6, 10**6, skip).edges
        )
    assert limited > 10  # the bounds cut some neighbourhoods short


def _degrees(rows: list[Row], ids: list[str]) -> dict[str, int]:
    counts = {node: sum(1 for row in rows if node in (row[1], row[2])) for node in ids}
    return {node: count for node, count in counts.items() if count}


def _touching(rows: list[Row], ids: list[str]) -> list[EdgeShape]:
    return [EdgeShape(*row) for row in rows if {row[1], row[2]} & set(ids)]
