"""The LoCoMo benchmark's core, on a tiny synthetic conversation with the hash embedder."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from bench.locomo import conversation_of, recall_at, report, run_conversation
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings


def record() -> dict[str, Any]:
    return {
        "sample_id": "conv-test",
        "conversation": {
            "speaker_a": "Ada",
            "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ada", "dia_id": "D1:1", "text": "Hi Ben, how was your week?"},
                {"speaker": "Ben", "dia_id": "D1:2", "text": "Great, I started playing the saxophone."},
                {"speaker": "Ada", "dia_id": "D1:3", "text": "That sounds lovely!"},
            ],
            "session_2_date_time": "10:15 am on 2 June, 2023",
            "session_2": [
                {"speaker": "Ada", "dia_id": "D2:1", "text": "I adopted a kitten called Pixel."},
                {
                    "speaker": "Ben",
                    "dia_id": "D2:2",
                    "text": "Congratulations!",
                    "blip_caption": "a grey cat",
                },
                {"speaker": "Ada", "dia_id": "D2:3", "text": "Thanks, she sleeps all day."},
            ],
        },
        "qa": [
            {
                "question": "Who plays the saxophone?",
                "answer": "saxophone",
                "evidence": ["D1:2"],
                "category": 4,
            },
            {"question": "What did Ada adopt?", "answer": "", "evidence": ["D:2:1; D9:9"], "category": 5},
            {"question": "Unanswerable", "answer": "", "evidence": ["D"], "category": 1},
        ],
    }


def test_a_record_becomes_sessions_of_messages_with_repaired_evidence() -> None:
    conversation = conversation_of(record())

    assert [len(session) for session in conversation.sessions] == [3, 3]
    first, shared = conversation.sessions[0][0], conversation.sessions[1][1]
    assert first.id == "D1:1" and first.time == datetime(2023, 5, 8, 13, 56)
    assert shared.text == "Congratulations! [shares an image: a grey cat]"
    assert [sorted(q.gold) for q in conversation.questions] == [["D1:2"], ["D2:1"]]
    assert conversation.dropped_evidence == ["D:2:1; D9:9", "D"]


def test_recall_at_k_counts_the_gold_ids_cited_by_the_first_k_results() -> None:
    citations = ["D1:1", "D2:3", "", "D1:2"]
    gold = frozenset({"D1:2", "D2:3"})

    assert recall_at(citations, gold, 2) == 0.5
    assert recall_at(citations, gold, 10) == 1.0


def test_every_message_is_cited_by_its_dia_id(tmp_path: Path) -> None:
    # Given six messages remembered in two calls, and top_k above six
    conversation = conversation_of(record())
    settings = load_settings(home=tmp_path, embedding_provider="hash", llm_url="")

    # When each question is recalled
    with Kenning(settings) as memory:
        seconds, rows = run_conversation(memory, conversation, ["CHUNKS", "CHUNKS_LEXICAL"])

    # Then every result maps back to a message, so all the gold is within the first 10
    assert len(seconds) == 2
    assert all(row["recall@10"] == 1.0 and row["uncited"] == 0 for row in rows["CHUNKS"])
    assert rows["CHUNKS_LEXICAL"][0]["recall@5"] == 1.0  # "saxophone" is in D1:2 alone
    figures = report(rows["CHUNKS"])
    assert figures["overall"]["questions"] == 1 and figures["adversarial"]["questions"] == 1
    assert list(figures["per_category"]) == ["4 single-hop"]
