"""A graph shape held in memory: degrees and edges per skip set, worked out once and kept."""

from __future__ import annotations

import pytest

from kenning.storage import graph_shape
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


def test_edges_are_built_once_and_shared_by_later_reads() -> None:
    shape = Shape.read(1, ROWS)

    first = shape.edges_of(["a"], frozenset({"next"}))
    again = shape.edges_of(["a", "b"], frozenset())

    assert sorted(e.id for e in first) == ["e1", "e4"]
    assert sorted(e.id for e in again) == ["e1", "e2", "e3", "e4"]
    by_id = {e.id: e for e in again}
    assert all(edge is by_id[edge.id] for edge in first)
    assert (by_id["e2"].source_id, by_id["e2"].target_id, by_id["e2"].relationship) == ("a", "c", "next")


def test_at_most_max_built_edges_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_shape, "MAX_BUILT", 2)
    shape = Shape.read(1, ROWS)

    edges = shape.edges_of(["a", "b"], frozenset())

    assert len(edges) == 4 and len(shape._built) == 2
