"""CONVERSATION's pure parts: turn points and their links, context scores, fusion options, spread."""

from __future__ import annotations

from datetime import date

import numpy as np
import pytest
from pydantic import ValidationError

from kenning.pipeline.models import Scope, ScoredPoint, stable_id
from kenning.retrieval.conversation import (
    TURNS,
    ConversationConfig,
    Turn,
    best_possible,
    closeness,
    context_text,
    dated,
    in_context,
    mend_turns,
    named_speaker,
    ranked,
    said_on,
    spoken_by,
    spread,
    turn_points,
    turns_of,
)
from kenning.retrieval.fusion import FusionConfig, reciprocal_rank_fusion
from kenning.storage.inference.embedder import HashEmbedder
from kenning.storage.vectors.memory import MemoryVectorStore


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
    # A lane misspelt or weighed below zero is an error, not a lane silently off
    with pytest.raises(ValidationError, match="'turn'.*the lanes are turns, chunks"):
        ConversationConfig.model_validate({"weights": {"turn": 1.0}})
    with pytest.raises(ValidationError, match="weights"):
        ConversationConfig.model_validate({"weights": {"turns": -1.0}})


def test_conversation_defaults_leave_the_hybrid_defaults_alone() -> None:
    assert ConversationConfig().rrf_k == 10
    assert FusionConfig().rrf_k == 60


def test_the_best_possible_score_bounds_every_fused_score() -> None:
    config = ConversationConfig(neighbour_share=0.2)
    lanes = {lane: ["a", "b", "c"] for lane in config.weights}
    fused = {e.id: e.score for e in reciprocal_rank_fusion(lanes, config.weights, config.rrf_k)}
    neighbours = {"a": ["b"], "b": ["a", "c"], "c": ["b"]}

    assert max(spread(fused, neighbours, config.neighbour_share).values()) <= best_possible(config)


SAID = "[2023-05-08T13:56:00] "
CHAT = ["Ada: Hi Ben", "Ben: I play the saxophone", "Ada: Since when?", "Ben: Last spring"]


def remembered(scope: Scope, spoken: bool) -> tuple[MemoryVectorStore, HashEmbedder, list[str]]:
    """A conversation's turns in a store; without `spoken`, as turns were stored before they kept it."""
    store, embedder = MemoryVectorStore(), HashEmbedder(32)
    ids = [stable_id("turn", str(n)) for n in range(len(CHAT))]
    said = [
        Turn(f"item-{n}", ids[n], "doc", SAID + text, CHAT[n - 1] if n else "", text if spoken else "")
        for n, text in enumerate(CHAT)
    ]
    store.ensure_collection(TURNS, embedder.dimension)
    store.upsert(
        scope, TURNS, turn_points(said, embedder.embed([context_text(t.context, t.text) for t in said]))
    )
    return store, embedder, ids


@pytest.mark.parametrize("spoken", [True, False])
def test_forgotten_turns_in_a_row_leave_the_next_read_after_the_last_one_kept(spoken: bool) -> None:
    scope, other = Scope(tenant="t", dataset="chat"), Scope(tenant="t", dataset="else")
    store, embedder, ids = remembered(scope, spoken)

    # When the two middle turns are forgotten (read first, then deleted, then mended)
    gone = turns_of(store, scope, ids[1:3])
    assert turns_of(store, other, ids[1:3]) == {}
    store.delete(scope, TURNS, ids[1:3])
    mended = mend_turns(store, embedder, scope, gone)

    # Then the last turn is read after the first, and the two are linked to each other
    assert mended == 1
    first, last = store.retrieve(scope, TURNS, [ids[0], ids[3]])
    expected = embedder.embed([context_text(CHAT[0], SAID + CHAT[3])])[0]
    assert np.allclose(last.vector, np.asarray(expected) / np.linalg.norm(expected), atol=1e-6)
    assert first.payload["next"] == ids[3] and last.payload["previous"] == ids[0]
    assert last.payload["text"] == SAID + CHAT[3]


def test_a_forgotten_last_turn_leaves_the_one_before_it_last() -> None:
    scope = Scope(tenant="t", dataset="chat")
    store, embedder, ids = remembered(scope, True)

    gone = turns_of(store, scope, ids[3:])
    store.delete(scope, TURNS, ids[3:])

    assert mend_turns(store, embedder, scope, gone) == 0
    [kept] = store.retrieve(scope, TURNS, [ids[2]])
    assert kept.payload["next"] is None


def test_a_turn_is_said_on_its_stored_day_or_the_day_its_text_starts_with() -> None:
    text = "[2023-05-08T13:56:00] Ben: hi"
    assert said_on({"said_at": "2023-06-01T09:00:00", "text": text}) == date(2023, 6, 1)
    assert said_on({"text": text}) == date(2023, 5, 8)
    assert said_on({"text": "Ben: hi"}) is None
    assert said_on({"said_at": "yesterday"}) is None


def test_only_one_speaker_named_by_a_whole_word_opens_the_speaker_lane() -> None:
    turns = [
        ScoredPoint(id=str(n), score=0.5, payload={"speaker": name})
        for n, name in enumerate(["Ada", "Ben", "", "Ada"])
    ]
    assert named_speaker(turns, "What did Ben say?") == "Ben"
    assert named_speaker(turns, "What did Adam say?") is None
    assert named_speaker(turns, "What did Ada tell Ben?") is None
    assert named_speaker(turns, "What was said?") is None
    assert named_speaker(turns, "What did ben say?") is None  # names are matched as spoken


def test_a_name_within_a_longer_name_named_too_does_not_count() -> None:
    turns = [ScoredPoint(id=name, score=0.5, payload={"speaker": name}) for name in ("Mary", "Mary Ann")]
    assert named_speaker(turns, "What did Mary Ann say?") == "Mary Ann"
    assert named_speaker(turns, "What did Mary say?") == "Mary"


def test_lanes_a_query_does_not_open_do_not_lower_the_best_possible_score() -> None:
    config = ConversationConfig()
    plain = ["turns", "chunks", "lexical", "lexical_context"]
    lanes = {lane: ["a", "b"] for lane in plain}
    fused = {e.id: e.score for e in reciprocal_rank_fusion(lanes, config.weights, config.rrf_k)}
    scores = spread(fused, {"a": ["b"], "b": ["a"]}, config.neighbour_share)

    # a turn first in every lane this query opened scores close to the best possible for it
    assert scores["a"] / best_possible(config, plain) > 0.8
    assert scores["a"] / best_possible(config) < 0.6


def test_the_named_lanes_hold_only_qualifying_turns_closest_first() -> None:
    turns = [
        ScoredPoint(id="a", score=0.5, payload={"speaker": "Ada", "said_at": "2023-06-01T09:00:00"}),
        ScoredPoint(id="b", score=0.1, payload={"speaker": "Ben", "said_at": "2023-06-01T10:00:00"}),
        ScoredPoint(id="c", score=0.0, payload={"speaker": "Ben", "said_at": "2023-05-08T10:00:00"}),
    ]
    close = closeness(turns, [], {"a": 4.0})

    assert close == pytest.approx({"a": 1.5, "b": 0.9, "c": 1.0})
    assert dated(turns, [(date(2023, 6, 1), date(2023, 6, 2))], close) == ["a", "b"]
    assert dated(turns, [], close) == []
    assert spoken_by(turns, "Ben", close) == ["c", "b"]
    assert spoken_by(turns, None, close) == []
