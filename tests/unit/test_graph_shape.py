"""A graph shape held in memory: degrees and edges per skip set, worked out once and kept."""

from __future__ import annotations

import gc
import random

from kenning.pipeline.models import EdgeShape
from kenning.storage.graph_shape import Shape
from kenning.storage.memory_graph import by_first_end

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

    first = [edge for edges in shape.edges_by_node(["a"], frozenset({"next"})).values() for edge in edges]
    again = [edge for edges in shape.edges_by_node(["a", "b"], frozenset()).values() for edge in edges]

    assert sorted(e.id for e in first) == ["e1", "e4"]
    assert sorted(e.id for e in again) == ["e1", "e2", "e3", "e4"]
    assert {e.id: e for e in again}["e2"] == EdgeShape("e2", "a", "c", "next")
    assert all(isinstance(edge, EdgeShape) for edge in [*first, *again])
    # Once a collection has gone over them, nothing the shape holds is tracked: a large graph
    # held in memory adds nothing to later full collections.
    gc.collect()
    assert not any(gc.is_tracked(row) for row in shape.edges)
    assert not any(gc.is_tracked(indexes) for indexes in shape.touching.values())


def test_edges_by_node_groups_each_edge_under_its_first_end_asked_in_id_order() -> None:
    """As `by_first_end` groups a read of the edges touching the nodes, on a random graph."""
    chance = random.Random(7)
    nodes = [f"n{n}" for n in range(30)]
    kinds = ["contains", "next", "knows"]
    rows = [
        (f"e{chance.randrange(10**6):06d}", chance.choice(nodes), chance.choice(nodes), chance.choice(kinds))
        for _ in range(200)
    ]
    rows = list({row[0]: row for row in rows}.values())
    shape = Shape.read(1, rows)
    for _ in range(20):
        asked = chance.sample(nodes, chance.randint(1, 10))
        skip = frozenset(chance.sample(kinds, chance.randint(0, 2)))

        def touching(ids: list[str], skip: frozenset[str] = skip) -> list[EdgeShape]:
            return [EdgeShape(*row) for row in rows if {row[1], row[2]} & set(ids) and row[3] not in skip]

        assert shape.edges_by_node(asked, skip) == by_first_end(touching)(asked)
