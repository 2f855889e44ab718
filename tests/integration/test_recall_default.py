"""Search and recall by default: each dataset searched as what it holds serves; one score
convention (in [0, 1], higher is better) and one top_k (results) for session and memory; every
recalled message with its speaker and time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from kenning.retrieval.contract import SearchType
from kenning.workers.api.app import create_app
from kenning.workers.application.lifecycle import Message
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

SAID = datetime(2024, 2, 12, 18, 30)
CHAT = [
    Message(speaker="Rosa", text="I finally bought a kayak, a bright yellow one.", time=SAID, id="k1"),
    Message(speaker="Theo", text="Nice! Where will you paddle first?", time=SAID, id="k2"),
    Message(speaker="Rosa", text="On the river Wye, the weekend after next.", time=SAID, id="k3"),
    Message(speaker="Theo", text="My brother rowed there for years.", time=SAID, id="k4"),
]
GUIDE = "The river Wye rises in Wales and flows south into the Severn estuary near Chepstow."


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    return tmp_path / "home"


@pytest.fixture
def memory(home: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=home, embedding_provider="hash", llm_url="")) as memory:
        yield memory


def test_remembered_messages_are_recalled_and_searched_with_the_conversation_search(memory: Kenning) -> None:
    # Given a remembered conversation
    memory.remember(CHAT, "chat")

    # When it is recalled and searched with no type
    recalled = memory.recall("Which boat did Rosa buy?", ["chat"])
    searched = memory.search("Which boat did Rosa buy?", datasets=["chat"], only_context=True)

    # Then both ran CONVERSATION, and say so
    assert recalled.searched == [SearchType.CONVERSATION]
    assert searched.type == SearchType.AUTO and searched.searched == [SearchType.CONVERSATION]
    assert any("kayak" in result.text for result in recalled.results[:2])
    assert {hit.extra["search"] for hit in searched.results} == {"CONVERSATION"}


def test_documents_are_recalled_with_the_graph_search(memory: Kenning) -> None:
    memory.add_text(GUIDE, "rivers", name="wye")
    memory.cognify("rivers")

    recalled = memory.recall("Where does the Wye flow?", ["rivers"])

    assert recalled.searched == [SearchType.HYBRID_COMPLETION]
    assert "Chepstow" in recalled.results[0].text


def test_a_dataset_of_messages_and_documents_is_searched_with_both_fused(memory: Kenning) -> None:
    # Given a dataset holding a remembered conversation and a document
    memory.remember(CHAT, "trip")
    memory.add_text(GUIDE, "trip", name="wye")
    memory.cognify("trip")

    # When it is searched with no type
    result = memory.search("river Wye", datasets=["trip"], only_context=True, top_k=10)

    # Then both searches ran, their hits fused in one ranking of messages and the document
    assert result.searched == [SearchType.CONVERSATION, SearchType.HYBRID_COMPLETION]
    texts = [hit.text for hit in result.results]
    assert any("Chepstow" in text for text in texts) and any(
        "Rosa: On the river Wye" in text for text in texts
    )
    scores = [hit.score for hit in result.results]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= score <= 1.0 for score in scores)


def test_an_explicit_type_wins(memory: Kenning) -> None:
    memory.remember(CHAT, "chat")

    assert memory.recall("kayak", ["chat"], type="CHUNKS_LEXICAL").searched == [SearchType.CHUNKS_LEXICAL]
    assert memory.search("kayak", "CHUNKS", datasets=["chat"], only_context=True).searched == [
        SearchType.CHUNKS
    ]


@pytest.mark.parametrize(
    "kind", ["CHUNKS", "CHUNKS_LEXICAL", "HYBRID_COMPLETION", "GRAPH_PPR", "GRAPH_COMPLETION", "CONVERSATION"]
)
def test_every_search_scores_in_0_1_best_first(memory: Kenning, kind: str) -> None:
    memory.remember(CHAT, "chat")
    memory.add_text(GUIDE, "chat", name="wye")
    memory.cognify("chat")

    hits = memory.search("Rosa kayak river Wye", kind, datasets=["chat"], only_context=True).results

    assert len(hits) >= 2
    scores = [hit.score for hit in hits]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= score <= 1.0 for score in scores)


def test_recall_ranks_session_entries_and_memories_in_one_list_of_top_k(memory: Kenning) -> None:
    # Given a remembered conversation, and a session that holds messages about the same
    memory.remember(CHAT, "chat")
    later = [
        Message(speaker="Rosa", text=f"The kayak trip, day {n}: calm water.", time=SAID) for n in (1, 2, 3)
    ]
    memory.session_messages(later, "chat", "trip-notes")

    # When it is recalled with the session and top_k 3
    recalled = memory.recall("kayak", ["chat"], session_id="trip-notes", top_k=3)

    # Then 3 results in all, best first, each scored in [0, 1], from both sources
    assert len(recalled.results) == 3
    scores = [result.score for result in recalled.results]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= score <= 1.0 for score in scores)
    everything = memory.recall("kayak", ["chat"], session_id="trip-notes", top_k=10)
    assert {result.source for result in everything.results} == {"session", "graph"}


@pytest.mark.parametrize("kind", ["CHUNKS", "CHUNKS_LEXICAL", "HYBRID_COMPLETION", "CONVERSATION"])
def test_a_recalled_message_has_its_speaker_and_time_whatever_found_it(memory: Kenning, kind: str) -> None:
    memory.remember(CHAT, "chat")

    recalled = memory.recall("kayak yellow", ["chat"], type=kind)

    top = next(result for result in recalled.results if "kayak" in result.text)
    assert (top.speaker, top.said_at) == ("Rosa", SAID)


def test_a_when_question_shows_the_days_its_messages_speak_of(memory: Kenning) -> None:
    memory.remember(
        [
            Message(speaker="Ines", text="We planted the apple tree yesterday.", time=SAID, id="t1"),
            Message(speaker="Jun", text="Lovely, apples next autumn then.", time=SAID, id="t2"),
        ],
        "garden",
    )

    result = memory.search("When did Ines plant the apple tree?", datasets=["garden"], only_context=True)

    planted = next(hit for hit in result.results if "apple tree" in hit.text)
    assert planted.extra["said_at"] == SAID.isoformat() and planted.extra["speaks_of"] == ["2024-02-11"]


def test_the_command_line_and_http_recall_by_what_was_stored(home: Path, memory: Kenning) -> None:
    memory.remember(CHAT, "chat")

    shown = CliRunner().invoke(main, ["recall", "Which boat did Rosa buy?", "--dataset", "chat"])
    assert shown.exit_code == 0, shown.output
    assert "searched with CONVERSATION" in shown.output

    runner = CliRunner()
    runner.invoke(main, ["user", "create", "rosa"])
    token = runner.invoke(main, ["key", "create", "--user", "rosa"]).output.strip().splitlines()[-1]
    runner.invoke(main, ["dataset", "share", "chat", "--user", "rosa", "--permission", "read"])
    with TestClient(create_app(memory)) as client:
        answer = client.post(
            "/v1/recall",
            headers={"Authorization": f"Bearer {token}"},
            json={"query": "Which boat did Rosa buy?", "datasets": ["chat"]},
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["searched"] == ["CONVERSATION"]
    assert answer.json()["results"][0]["speaker"] == "Rosa"


def test_the_day_before_an_event_is_read_against_the_day_it_was_spoken_of(memory: Kenning) -> None:
    # Given four days of messages, and a concert spoken of on the third
    days = {
        9: ["Ada: I baked a lemon cake.", "Ben: Smells lovely from here."],
        11: ["Ben: I walked the dog."],
    }
    days[10] = [
        "Ben: Morning! Ready for tonight?",
        "Ada: The jazz concert was wonderful.",
        "Ben: Great drums.",
    ]
    days[8] = ["Ben: I repaired the garden fence."]
    messages = [
        Message(speaker=line.split(": ")[0], text=line.split(": ")[1], time=datetime(2024, 6, day, 9, n))
        for day in sorted(days)
        for n, line in enumerate(days[day])
    ]
    memory.remember(messages, "week")

    # When a question asks what happened the day before the concert
    found = memory.recall("What happened the day before the jazz concert?", ["week"], top_k=3).results

    # Then the messages of the day before come with the concert's, and no other day's
    said = {result.said_at.day for result in found if result.said_at}
    assert said == {9, 10} and any("lemon cake" in result.text for result in found)
