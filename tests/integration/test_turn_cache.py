"""Recall of remembered messages gives the same results from the turns it keeps as from a fresh read,
and keeps nothing of a message once it is forgotten."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from kenning.retrieval.turn_cache import turn_cache
from kenning.workers.application.lifecycle import Message
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

MAY, JUNE = datetime(2023, 5, 8, 10), datetime(2023, 6, 1, 9)
CHAT = [
    Message(speaker="Ada", text="What instrument did you pick up?", time=MAY, id="D1:1"),
    Message(speaker="Ben", text="The saxophone, last spring.", time=MAY, id="D1:2"),
    Message(speaker="Ada", text="My kitten Pixel sleeps all day since Tuesday.", time=MAY, id="D1:3"),
    Message(speaker="Ben", text="Cats are like that.", time=MAY, id="D1:4"),
    Message(speaker="Ben", text="We swam in the lake yesterday, cold water.", time=JUNE, id="D2:1"),
    Message(speaker="Ada", text="Brave of you. I painted a sunrise for three hours.", time=JUNE, id="D2:2"),
    Message(speaker="Ben", text="Show me the painting next week!", time=JUNE, id="D2:3"),
]
# Plain, speaker, dated, relative, when, how long, ordered and anchored questions: every lane.
QUESTIONS = [
    "Which instrument?",
    "What does Ben say about cats?",
    "What happened on 31 May, 2023?",
    "What did they talk about last week?",
    "When did Ben swim in the lake?",
    "How long did Ada paint?",
    "What did Ada mention first?",
    "What was said the day before the swim?",
]


def open_memory(home: Path) -> Kenning:
    return Kenning(load_settings(home=home, embedding_provider="hash", llm_url=""))


def results(kenning: Kenning, query: str) -> list[dict[str, Any]]:
    recalled = kenning.recall(query, ["chat"], top_k=10)
    return [r.model_dump() for r in recalled.results]


def test_results_from_the_kept_turns_are_those_of_a_fresh_read(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given a remembered conversation, and the turns kept by no query yet
        kenning.remember(CHAT, "chat")
        scope = kenning.scope("chat")
        cache = turn_cache(kenning.wiring.vectors)

        for question in QUESTIONS:
            # When each question is recalled from a fresh read, then again from the turns kept
            cache.drop(scope)
            fresh = results(kenning, question)
            assert len(cache.held(scope)) == len(CHAT)
            kept = results(kenning, question)

            # Then the results are the same, scores and marks included
            assert kept == fresh, question
            assert fresh


def test_a_forgotten_message_is_in_no_result_and_not_kept(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given a remembered conversation, recalled (its turns kept)
        done = kenning.remember(CHAT, "chat")
        scope = kenning.scope("chat")
        recalled = kenning.recall("saxophone last spring", ["chat"], top_k=10)
        saxophone = next(r for r in recalled.results if "saxophone" in r.text)
        assert saxophone.chunk_id in turn_cache(kenning.wiring.vectors).held(scope)

        # When the saxophone message is forgotten
        kenning.forget("chat", [saxophone.data_id or ""])

        # Then nothing kept of the turns holds it, before any other recall
        held = turn_cache(kenning.wiring.vectors).held(scope)
        assert saxophone.chunk_id not in held
        assert all("saxophone" not in known.text for known in held.values())
        # And recall never cites it nor shows its words; what it keeps after holds none of it
        recalled = kenning.recall("saxophone last spring", ["chat"], top_k=10)
        assert saxophone.data_id not in {r.data_id for r in recalled.results}
        assert all("saxophone" not in r.text for r in recalled.results)
        assert len(recalled.results) == len(CHAT) - 1 == len(done.item_ids) - 1
        held = turn_cache(kenning.wiring.vectors).held(scope)
        assert len(held) == len(CHAT) - 1
        assert all("saxophone" not in known.text for known in held.values())


def test_a_dataset_forgotten_whole_leaves_nothing_kept(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given a remembered conversation, recalled
        kenning.remember(CHAT, "chat")
        kenning.recall("Which instrument?", ["chat"], top_k=10)
        scope = kenning.scope("chat")
        assert turn_cache(kenning.wiring.vectors).held(scope)

        # When the whole dataset is forgotten
        kenning.forget("chat")

        # Then none of its turns is kept
        assert turn_cache(kenning.wiring.vectors).held(scope) == {}
