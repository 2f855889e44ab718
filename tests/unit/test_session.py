"""Session entries and keyword search over them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from kenning.pipeline.lexical import bm25_term
from kenning.pipeline.session import SessionEntry, check_score, search_entries


def test_search_ranks_entries_by_bm25_over_question_answer_and_speaker() -> None:
    entries = [
        SessionEntry(question="Who built the analytical engine?", answer="Charles Babbage designed it."),
        SessionEntry(kind="message", question="I love engines and engines of all kinds", speaker="Grace"),
        SessionEntry(question="What is the weather like?", answer="Sunny."),
        SessionEntry(kind="message", question="Notes on the lecture", speaker="Babbage"),
    ]

    hits = search_entries(entries, "Babbage engine", limit=10)

    assert [entry for entry, _ in hits] == [entries[0], entries[1], entries[3]]
    assert all(score > 0 for _, score in hits)
    assert [score for _, score in hits] == sorted((score for _, score in hits), reverse=True)


def test_search_scores_are_exactly_bm25_over_the_entries_given() -> None:
    entries = [SessionEntry(question="alpha beta"), SessionEntry(question="alpha alpha gamma delta")]

    [(first, first_score), (second, second_score)] = search_entries(entries, "alpha", limit=5)

    # Two mentions in four tokens beat one in two; the average length is three tokens
    assert first is entries[1] and first_score == pytest.approx(bm25_term(2, 2, 2, 4, 3.0))
    assert second is entries[0] and second_score == pytest.approx(bm25_term(1, 2, 2, 2, 3.0))


def test_search_leaves_out_entries_with_no_query_term_and_honours_the_limit() -> None:
    entries = [SessionEntry(question=f"topic {n}") for n in range(5)] + [SessionEntry(question="unrelated")]

    assert len(search_entries(entries, "topics", limit=3)) == 3
    assert search_entries(entries, "nothing here matches", limit=3) == []
    assert search_entries(entries, "the of", limit=3) == []
    assert search_entries(entries, "topic", limit=0) == []
    assert search_entries([], "topic", limit=3) == []


def test_search_breaks_ties_towards_the_newer_entry() -> None:
    entries = [SessionEntry(question="same words"), SessionEntry(question="same words")]

    hits = search_entries(entries, "words", limit=2)

    assert [entry for entry, _ in hits] == [entries[1], entries[0]]
    assert search_entries(entries, "words", limit=2) == hits


def test_entries_get_ids_and_aware_utc_times() -> None:
    first, second = SessionEntry(), SessionEntry(time=datetime(2025, 1, 1, 12, 0))

    assert first.id != second.id and len(first.id) == 32
    assert first.time.tzinfo is UTC
    assert second.time == datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("score", [0, 6])
def test_a_feedback_score_outside_one_to_five_is_refused(score: int) -> None:
    with pytest.raises(ValidationError):
        SessionEntry(feedback_score=score)
    with pytest.raises(ValueError, match="1..5"):
        check_score(score)
    with pytest.raises(ValueError, match="1..5"):
        SessionEntry().with_feedback("text", score)
    assert SessionEntry().with_feedback("fine", 5).feedback_score == 5
