"""A graph shape held in memory: degrees and edges per skip set, worked out once and kept."""

from __future__ import annotations

import gc

from kenning.pipeline.models import EdgeShape
from kenning.storage.graph_shape import Shape

ROWS = [
    ("e1", "a", "b", "contains"),
    ("e2", "a", "c", "next"),
    ("e3", "b", "c", "contains"),
    ("e4", "a", "a", "contains"),
]


def test_degrees_follow_the_skip_set_asked_each_time() -> None:
    shape = Shape.read(1, ROWS)

    assert shape.degrees(["a", "b", "z"], frozenset()) == {"a": 3, "b": 2}
    assert shape.degrees(["a", "b"], frozenset({"next"})) == {"a": 2, "b": 2}
    assert shape.degrees(["c"], frozenset({"next", "contains"})) == {}
    # asked again, from what was kept: the same answers
    assert shape.degrees(["a"], frozenset()) == {"a": 3}
    assert shape.degrees(["a"], frozenset({"next"})) == {"a": 2}


def test_edges_come_as_shapes_and_the_collector_tracks_nothing_the_shape_holds() -> None:
    shape = Shape.read(1, ROWS)

    first = shape.edges_of(["a"], frozenset({"next"}))
    again = shape.edges_of(["a", "b"], frozenset())

    assert sorted(e.id for e in first) == ["e1", "e4"]
    assert sorted(e.id for e in again) == ["e1", "e2", "e3", "e4"]
    assert {e.id: e for e in again}["e2"] == EdgeShape("e2", "a", "c", "next")
    assert all(isinstance(edge, EdgeShape) for edge in [*first, *again])
    # Once a collection has gone over them, nothing the shape holds is tracked: a large graph
    # held in memory adds nothing to later full collections.
    gc.collect()
    assert not any(gc.is_tracked(row) for row in shape.edges)
    assert not any(gc.is_tracked(indexes) for indexes in shape.touching.values())
