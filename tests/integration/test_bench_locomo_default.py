"""The LoCoMo benchmark reports `recall`'s default beside every type, per category and per half."""

from __future__ import annotations

from pathlib import Path

from bench.locomo import (
    DEFAULT,
    conversation_of,
    grid,
    option_label,
    recall_latency,
    report,
    run_conversation,
    split,
    table,
)
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.test_bench_locomo import record


def test_the_default_is_reported_beside_each_type_for_both_halves(tmp_path: Path) -> None:
    # Given the tiny conversation, its questions drawn into halves
    [conversation] = split([conversation_of(record())])
    settings = load_settings(home=tmp_path, embedding_provider="hash", llm_url="")

    # When its questions are recalled with the default and with CHUNKS
    with Kenning(settings) as memory:
        _, rows = run_conversation(memory, conversation, [DEFAULT, "CHUNKS"])
    results = {kind: report(found) for kind, found in rows.items()}

    # Then the default ran the conversation search, and each figure is there for both halves
    assert results[DEFAULT]["searched"] == {"CONVERSATION": 2}
    assert results["CHUNKS"]["searched"] == {"CHUNKS": 2}
    halves = {q.split for q in conversation.questions if q.category != 5}
    for half in halves:
        assert results[DEFAULT][f"per_category_{half}"]["4 single-hop"]["recall@10"] == 1.0
    shown = table(results).splitlines()
    assert shown[0].startswith("| type | dev | test | 4 single-hop dev/test")
    assert [line.split(" | ")[0] for line in shown[2:]] == [f"| {DEFAULT}", "| CHUNKS"]


def test_the_tuning_grid_tries_the_time_and_graph_lanes() -> None:
    labels = [option_label(options) for options in grid()]
    assert "timed=1,ordered=1,graph=0" in labels and "timed=3,ordered=1,graph=1" in labels
    assert all(options["weights"]["dated"] == 2.0 for options in grid())


def test_the_default_recall_latency_is_given_per_question_against_its_target() -> None:
    # Given 100 recalls of 10 to 109 ms, in two conversations
    rows = [{"seconds": (10 + n) / 1000} for n in range(100)]
    figures = recall_latency(rows, {"a": rows[:50], "b": rows[50:]})

    # Then the percentiles are of every question, each conversation's of its own
    assert (figures["questions"], figures["p50_ms"], figures["p95_ms"], figures["max_ms"]) == (
        100,
        60.0,
        105.0,
        109.0,
    )
    assert figures["p95_under_target"] is False
    assert figures["per_conversation"]["a"] == {"p50_ms": 35.0, "p95_ms": 57.0}
    assert recall_latency(rows[:30], {})["p95_under_target"] is True
