"""CONVERSATION recall on an embedded memory: turns cite their own message; forget takes a turn away."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from kenning.retrieval.conversation import TURNS
from kenning.workers.lifecycle import Message
from kenning.workers.memory import Kenning
from kenning.workers.settings import load_settings

SAID = datetime(2023, 5, 8, 13, 56)
CHAT = [
    Message(speaker="Ada", text="What instrument did you pick up?", time=SAID, id="D1:1"),
    Message(speaker="Ben", text="The saxophone, last spring.", time=SAID, id="D1:2"),
    Message(speaker="Ada", text="My kitten Pixel sleeps all day.", time=SAID, id="D1:3"),
    Message(speaker="Ben", text="Cats are like that.", time=SAID, id="D1:4"),
]


def open_memory(home: Path) -> Kenning:
    return Kenning(load_settings(home=home, embedding_provider="hash", llm_url=""))


def message_ids(kenning: Kenning, dataset: str) -> dict[str, str]:
    found = kenning.dataset(dataset)
    return {item.id: item.source.removeprefix("id:") for item in kenning.wiring.metadata.list_items(found.id)}


def test_each_turn_is_indexed_once_and_every_hit_cites_its_own_message(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given a conversation remembered in one call
        kenning.remember(CHAT, "chat")
        names = message_ids(kenning, "chat")

        # When it is recalled with more results than messages
        recalled = kenning.recall("Which instrument?", ["chat"], type="CONVERSATION", top_k=10)

        # Then there is one turn per message, and each hit is one message, cited by its own id
        assert kenning.wiring.vectors.count(kenning.scope("chat"), TURNS) == len(CHAT)
        cited = [names[r.data_id or ""] for r in recalled.results]
        assert sorted(cited) == ["D1:1", "D1:2", "D1:3", "D1:4"]
        texts = {names[r.data_id or ""]: r.text for r in recalled.results}
        assert texts["D1:2"].endswith("Ben: The saxophone, last spring.")
        assert "instrument" not in texts["D1:2"]  # the context is in the vector, not the text


def test_forgetting_a_message_takes_its_turn_away_and_its_neighbours_stay(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given a remembered conversation
        done = kenning.remember(CHAT, "chat")
        names = message_ids(kenning, "chat")
        saxophone = next(item for item, dia in names.items() if dia == "D1:2")

        # When the saxophone message is forgotten
        kenning.forget("chat", [saxophone])

        # Then its turn is gone, recall never cites it nor shows its words, and the others remain
        assert kenning.wiring.vectors.count(kenning.scope("chat"), TURNS) == len(CHAT) - 1
        recalled = kenning.recall("saxophone last spring", ["chat"], type="CONVERSATION", top_k=10)
        assert saxophone not in {r.data_id for r in recalled.results}
        assert all("saxophone" not in r.text for r in recalled.results)
        assert len(recalled.results) == 3 and len(done.item_ids) == 4


def test_a_dataset_without_turns_is_recalled_from_its_chunks(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given text added and cognified, never remembered as a conversation
        kenning.add_text("Ada Lovelace wrote the first program.", "notes")
        kenning.cognify("notes")

        # Then CONVERSATION still finds it, through the chunk and lexical lanes
        recalled = kenning.recall("first program", ["notes"], type="CONVERSATION")
        assert [r.text for r in recalled.results] == ["Ada Lovelace wrote the first program."]
