"""Decay with access reinforcement, prune, session history in completions, session records."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from kenning.pipeline.models import utcnow
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring


class EchoCompleter:
    """Answers with the prompt it was given, so a test can read what the LLM saw."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def complete(self, system: str, prompt: str) -> str:
        self.prompts.append(prompt)
        return f"answer {len(self.prompts)}"


def age(memory: Kenning, days: float) -> None:
    """Make every item of the home look added `days` ago."""
    with memory.wiring.engine.begin() as conn:
        conn.execute(sa.text("UPDATE data_items SET created_at = :t"), {"t": utcnow() - timedelta(days=days)})


def test_unused_memories_fade_and_used_ones_are_reinforced(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", decay_half_life_days=30.0)
    with Kenning(settings) as memory:
        # Given two near-identical notes, added 90 days ago
        memory.add_text("Harbour ships log: calm seas, first entry.", "log", name="a")
        memory.add_text("Harbour ships log: calm seas, second entry.", "log", name="b")
        memory.cognify("log")
        age(memory, 90)

        # When only the second one is used, again and again (retrievals are written in batches)
        for _ in range(3):
            memory.search("second entry", "CHUNKS", datasets=["log"], top_k=1)
        memory._accessed.flush()

        # Then it is fresh and comes first, though the first is a hair closer to the query;
        # the other has faded by three half-lives (0.3 * 7/8 taken from its score)
        again = memory.search("Harbour ships log calm seas", "CHUNKS", datasets=["log"], top_k=2).results
        assert "second" in again[0].text and again[0].score > 0.8 > 0.6 > again[1].score


def test_prune_forgets_what_is_old_and_unused(tmp_path: Path) -> None:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        memory.add_text("An old note about lighthouses.", "log", name="old")
        memory.cognify("log")
        age(memory, 400)
        memory.add_text("A new note about harbours.", "log", name="new")
        memory.cognify("log")

        pruned = memory.prune("log", older_than_days=365)

        assert len(pruned.items) == 1
        texts = [hit.text for hit in memory.search("note", "CHUNKS", datasets=["log"]).results]
        assert texts == ["A new note about harbours."]
        assert memory.prune("log", older_than_days=365).items == []


def test_completions_see_the_session_history_and_answers_join_it(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", session_history=2)
    completer = EchoCompleter()
    with Kenning(settings, Wiring(settings, {"completer": completer})) as memory:
        memory.remember("Caroline adopted a dog named Rex.", "chat")
        memory.search("What is the dog called?", "RAG_COMPLETION", datasets=["chat"], session_id="s")
        memory.search("Who adopted it?", "RAG_COMPLETION", datasets=["chat"], session_id="s")
        memory.search("When?", "RAG_COMPLETION", datasets=["chat"], session_id="s")

        # The first call had no history; the third saw the last two exchanges only
        assert "Conversation so far" not in completer.prompts[0]
        assert "Q: What is the dog called?\nA: answer 1" in completer.prompts[1]
        third = completer.prompts[2]
        assert "Q: Who adopted it?" in third and "What is the dog called?" in third
        entries = memory.get_session("s")
        assert [e.answer for e in entries] == ["answer 1", "answer 2", "answer 3"]
        assert all(e.element_ids for e in entries)
        record = memory.wiring.session_records.get(memory.session_key("s"))
        assert record is not None and record.state() == "running"
