"""CONVERSATION recall on an embedded memory: turns cite their own message; forget takes a turn away."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from kenning.retrieval.conversation import TURN_FIELDS, TURNS, context_text
from kenning.workers.application.conversation import spoken
from kenning.workers.application.lifecycle import Message
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

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


def test_forgetting_a_message_takes_its_words_out_of_the_next_turn(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given a remembered conversation
        kenning.remember(CHAT, "chat")
        names = message_ids(kenning, "chat")
        item = {dia: data_id for data_id, dia in names.items()}
        scope = kenning.scope("chat")
        target = kenning.dataset("chat")
        chunk = {names[c.data_id]: c.id for c in kenning.wiring.chunks.chunks_of(target.id, list(names))}

        # When the saxophone message, in the middle, is forgotten
        kenning.forget("chat", [item["D1:2"]])

        # Then the turn after it is read after the turn before it, as if it had never been said
        expected = kenning.wiring.embedder.embed([context_text(spoken(CHAT[0]), CHAT[2].as_text())])[0]
        hits = kenning.wiring.vectors.search(scope, TURNS, expected, limit=10, fields=TURN_FIELDS)
        by_id = {hit.id: hit for hit in hits}
        assert set(by_id) == {chunk["D1:1"], chunk["D1:3"], chunk["D1:4"]}
        assert by_id[chunk["D1:3"]].score == pytest.approx(0.0, abs=1e-5)
        # And the neighbours are linked around the gap, never to the forgotten chunk
        assert by_id[chunk["D1:1"]].payload["next"] == chunk["D1:3"]
        assert by_id[chunk["D1:3"]].payload["previous"] == chunk["D1:1"]
        assert chunk["D1:2"] not in {h.payload.get(k) for h in hits for k in ("previous", "next")}


def test_forgetting_the_first_message_leaves_the_next_turn_without_context(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given a remembered conversation
        kenning.remember(CHAT, "chat")
        names = message_ids(kenning, "chat")
        item = {dia: data_id for data_id, dia in names.items()}
        target = kenning.dataset("chat")
        chunk = {names[c.data_id]: c.id for c in kenning.wiring.chunks.chunks_of(target.id, list(names))}

        # When its first message is forgotten
        kenning.forget("chat", [item["D1:1"]])

        # Then the second turn embeds its own words only, and starts the conversation
        alone = kenning.wiring.embedder.embed([CHAT[1].as_text()])[0]
        hits = kenning.wiring.vectors.search(
            kenning.scope("chat"), TURNS, alone, limit=10, fields=TURN_FIELDS
        )
        first = next(hit for hit in hits if hit.id == chunk["D1:2"])
        assert first.score == pytest.approx(0.0, abs=1e-5)
        assert first.payload["previous"] is None


MAY, JUNE = datetime(2023, 5, 8, 10), datetime(2023, 6, 1, 9)
LAKE = [
    Message(speaker="Ben", text="We went to the lake for a picnic.", time=MAY, id="D1:1"),
    Message(speaker="Ada", text="Sounds lovely.", time=MAY, id="D1:2"),
    Message(speaker="Ben", text="Swam at dawn, cold water.", time=JUNE, id="D2:1"),
    Message(speaker="Ada", text="Brave of you.", time=JUNE, id="D2:2"),
]
TALK = [
    Message(speaker="Ada", text="I love the saxophone and the lake.", time=SAID, id="D1:1"),
    Message(speaker="Ada", text="Jazz saxophone at the lake house, I love it.", time=SAID, id="D1:2"),
    Message(speaker="Ben", text="Hmm.", time=SAID, id="D1:3"),
    Message(speaker="Ada", text="Anyway.", time=SAID, id="D1:4"),
    Message(speaker="Ben", text="Honestly I love the violin.", time=SAID, id="D1:5"),
]
NO_NAMED_LANES = {"weights": {"turns": 1.0, "chunks": 1.0, "lexical": 1.0, "lexical_context": 1.0}}


def first_cited(kenning: Kenning, query: str, options: dict[str, object] | None = None) -> str:
    recalled = kenning.recall(query, ["chat"], type="CONVERSATION", top_k=4, options=options)
    return message_ids(kenning, "chat")[recalled.results[0].data_id or ""]


def test_a_query_naming_a_day_recalls_what_was_said_that_day_first(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given a lake picnic on 8 May and a swim on 1 June
        kenning.remember(LAKE, "chat")
        query = "What was done at the lake on 1 June, 2023?"

        # Then a query naming 1 June (and no speaker) recalls that day first, though the picnic
        # shares its words
        assert first_cited(kenning, query).startswith("D2:")
        assert first_cited(kenning, query, NO_NAMED_LANES).startswith("D1:")
        # And naming the month does the same
        assert first_cited(kenning, "What was done at the lake in June 2023?").startswith("D2:")


def test_a_query_naming_a_speaker_recalls_that_speaker_s_turns_first(tmp_path: Path) -> None:
    with open_memory(tmp_path) as kenning:
        # Given Ada's words about the saxophone and the lake, and Ben's short answers
        kenning.remember(TALK, "chat")
        query = "What does Ben love, the saxophone or the lake?"

        # Then a query naming Ben recalls Ben's turn first, though Ada's share more of its words
        assert first_cited(kenning, query) in {"D1:3", "D1:5"}
        assert first_cited(kenning, query, NO_NAMED_LANES) in {"D1:1", "D1:2"}
