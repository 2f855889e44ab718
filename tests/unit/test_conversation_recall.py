"""CONVERSATION's pure parts: turn points and their links, context scores, fusion options, spread."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kenning.retrieval.conversation import (
    ConversationConfig,
    Turn,
    best_possible,
    context_text,
    in_context,
    ranked,
    spread,
    turn_points,
)
from kenning.retrieval.fusion import FusionConfig, reciprocal_rank_fusion


def turns() -> list[Turn]:
    return [
        Turn("item-1", "chunk-1", "doc-1", "Ada: Hi Ben"),
        Turn("item-2", "chunk-2", "doc-2", "Ben: I play the saxophone", context="Ada: Hi Ben"),
        Turn("item-3", "chunk-3", "doc-3", "Ada: Lovely", context="Ben: I play the saxophone"),
    ]


def test_each_turn_point_cites_its_own_message_and_links_its_neighbours() -> None:
    points = turn_points(turns(), [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])

    assert [p.id for p in points] == ["chunk-1", "chunk-2", "chunk-3"]
    middle = points[1].payload
    assert middle["data_ids"] == ["item-2"] and middle["text"] == "Ben: I play the saxophone"
    assert (middle["previous"], middle["next"]) == ("chunk-1", "chunk-3")
    assert points[0].payload["previous"] is None and points[2].payload["next"] is None


def test_turn_points_refuse_a_vector_count_that_does_not_match() -> None:
    with pytest.raises(ValueError, match="3 turns but 2 vectors"):
        turn_points(turns(), [[1.0], [0.0]])


def test_the_context_comes_before_the_message_and_only_when_there_is_one() -> None:
    assert context_text("Ada: Hi Ben", "Ben: Hello") == "Ada: Hi Ben\nBen: Hello"
    assert context_text("", "Ben: Hello") == "Ben: Hello"


def test_a_turn_in_context_adds_a_share_of_the_turn_before_it() -> None:
    scores = {"a": 4.0, "b": 1.0}
    previous = {"a": None, "b": "a", "c": "b", "d": "x"}

    found = in_context(scores, previous, 0.5)

    # b gets half of a; c, unscored, follows b; d follows a turn that did not score
    assert found == {"a": 4.0, "b": 3.0, "c": 0.5}
    assert in_context(scores, previous, 0.0) == scores


def test_spread_reaches_direct_neighbours_only() -> None:
    neighbours = {"a": ["b"], "b": ["a", "c"], "c": ["b", "d"], "d": ["c"]}

    found = spread({"a": 1.0}, neighbours, 0.2)

    # one step: b gets a share of a; c and d, two and three steps away, get nothing
    assert found == {"a": 1.0, "b": 0.2}
    assert spread({"a": 1.0}, neighbours, 0.0) == {"a": 1.0}


def test_spread_can_lift_a_neighbour_above_a_lone_hit() -> None:
    scores = {"answer": 0.5, "question": 1.0, "lone": 0.6}
    neighbours = {"answer": ["question"], "question": ["answer"]}

    assert ranked(spread(scores, neighbours, 0.3))[:2] == ["question", "answer"]
    assert ranked(scores)[:2] == ["question", "lone"]


def test_the_rrf_k_is_a_per_call_option_and_changes_the_order() -> None:
    # Given two lanes: x first in one, y second in both
    lanes = {"turns": ["x", "y"], "lexical": ["z", "y"]}
    weights = {"turns": 1.0, "lexical": 1.0}

    small = ConversationConfig.model_validate({"rrf_k": 0})
    large = ConversationConfig.model_validate({"rrf_k": 60, "unknown": 1})

    # Then with k=0 one first place beats two second places, with k=60 agreement wins
    assert ranked({e.id: e.score for e in reciprocal_rank_fusion(lanes, weights, small.rrf_k)})[0] == "x"
    assert ranked({e.id: e.score for e in reciprocal_rank_fusion(lanes, weights, large.rrf_k)})[0] == "y"
    with pytest.raises(ValidationError):
        ConversationConfig.model_validate({"neighbour_share": 2.0})


def test_conversation_defaults_leave_the_hybrid_defaults_alone() -> None:
    assert ConversationConfig().rrf_k == 10
    assert FusionConfig().rrf_k == 60


def test_the_best_possible_score_bounds_every_fused_score() -> None:
    config = ConversationConfig(neighbour_share=0.2)
    lanes = {lane: ["a", "b", "c"] for lane in config.weights}
    fused = {e.id: e.score for e in reciprocal_rank_fusion(lanes, config.weights, config.rrf_k)}
    neighbours = {"a": ["b"], "b": ["a", "c"], "c": ["b"]}

    assert max(spread(fused, neighbours, config.neighbour_share).values()) <= best_possible(config)
