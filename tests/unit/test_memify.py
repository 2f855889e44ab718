"""Improve's pure rules: feedback weights, name keys and acronyms, grouping never across types."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kenning.pipeline.memify import Rating, acronym, duplicate_groups, feedback_weights, name_key
from kenning.pipeline.models import GraphNode

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def entity(node_id: str, name: str, kind: str = "Place") -> GraphNode:
    return GraphNode(id=node_id, type="Entity", properties={"name": name, "entity_type": kind})


def test_weights_move_toward_each_rating_in_time_order_and_stay_in_bounds() -> None:
    rated = [
        Rating(element_ids=["a"], score=1, time=T0 + timedelta(minutes=1)),
        Rating(element_ids=["a", "b"], score=5, time=T0),
    ]
    weights = feedback_weights(rated, alpha=0.5)
    # a: 0.5 -> 0.75 (score 5 first) -> 0.375 (score 1 later); b: 0.5 -> 0.75
    assert weights == {"a": 0.375, "b": 0.75}
    many = [Rating(element_ids=["a"], score=5, time=T0 + timedelta(seconds=n)) for n in range(50)]
    assert 0.99 < feedback_weights(many, alpha=1.0)["a"] <= 1.0
    assert feedback_weights(list(reversed(rated)), alpha=0.5) == weights


def test_names_that_mean_the_same_share_a_key() -> None:
    assert name_key("The Beatles") == name_key("beatles") == name_key("Beatle")
    assert name_key("Falcon Dynamics's") == name_key("Falcon Dynamics")
    assert name_key("New York City") != name_key("New York")
    assert acronym("New York City") == "nyc" and acronym("United States of America") == "usa"
    assert acronym("Boston") == ""


def test_duplicates_group_by_name_and_acronym_never_across_types() -> None:
    nodes = [
        entity("1", "New York City"),
        entity("2", "NYC"),
        entity("3", "N.Y.C."),
        entity("4", "NYC", kind="Organization"),
        entity("5", "the Beatles", kind="Group"),
        entity("6", "Beatles", kind="Group"),
        entity("7", "Boston"),
    ]
    assert duplicate_groups(nodes) == [["1", "2", "3"], ["5", "6"]]
    assert duplicate_groups(nodes, similar=[("7", "4")]) == [["1", "2", "3"], ["5", "6"]]
    assert duplicate_groups(nodes, similar=[("7", "1")]) == [["1", "2", "3", "7"], ["5", "6"]]
