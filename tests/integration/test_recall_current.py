"""Recall over remembered messages answers from what is true now, or at `as_of`: a message whose
facts on the question no longer hold stays (history is kept) but is marked and ranked below, and
the fact holding instead comes first (`kenning.retrieval.currency`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kenning.workers.application.lifecycle import Recollection
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

OSLO = "[2023-01-10] Ana: I live in Oslo and work for Norsk Data."
BERLIN = "[2024-06-02] Ana: We moved to Berlin last month; I joined Zalando."
QUESTION = "Where does Ana live?"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    return tmp_path / "home"


@pytest.fixture
def memory(home: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        memory.remember(OSLO, "ana")
        memory.remember(BERLIN, "ana")
        yield memory


def said(results: list[Recollection], city: str) -> Recollection:
    [found] = [r for r in results if r.kind == "chunk" and city in r.text]
    return found


def test_recall_answers_where_ana_lives_now(memory: Kenning) -> None:
    # When Ana is asked about after she moved
    results = memory.recall(QUESTION, ["ana"]).results

    # Then the fact true now comes first, then the message that says it, then the old message,
    # kept, and marked with when it held and what holds instead
    assert [r.kind for r in results[:3]] == ["fact", "chunk", "chunk"]
    assert results[0].text == "Ana moved to Berlin (since 2024-05)"
    assert "Berlin" in results[1].text and results[1].held == ""
    oslo = said(results, "Oslo")
    assert results.index(oslo) == 2 and oslo.score < results[1].score
    assert oslo.held == "2023-01-10 to 2024-05"
    assert oslo.instead == ["Ana moved to Berlin (since 2024-05)"]


def test_recall_as_of_2023_answers_oslo(memory: Kenning) -> None:
    # When asked as of mid-2023, before the move
    results = memory.recall(QUESTION, ["ana"], as_of="2023-06-01").results

    # Then Oslo, true then, comes first, and the later move is kept but marked and last
    assert results[0].kind == "fact" and results[0].text == "Ana live in Oslo (2023-01-10 to 2024-05)"
    assert "Oslo" in results[1].text and results[1].held == ""
    berlin = said(results, "Berlin")
    assert results.index(berlin) == 2
    assert berlin.held == "since 2024-05"
    assert berlin.instead == ["Ana live in Oslo (2023-01-10 to 2024-05)"]


def test_a_question_on_what_did_not_change_is_left_as_it_is(memory: Kenning) -> None:
    # When asked about something no retired fact speaks of
    results = memory.recall("Norsk Data", ["ana"]).results

    # Then nothing is marked and no fact is added
    assert results and all(r.kind == "chunk" and not r.held and not r.instead for r in results)


def test_conversation_search_marks_the_old_message_and_can_be_turned_off(memory: Kenning) -> None:
    # When CONVERSATION is asked directly, and with the option off
    found = memory.search(QUESTION, "CONVERSATION", datasets=["ana"], only_context=True)
    plain = memory.search(
        QUESTION, "CONVERSATION", datasets=["ana"], only_context=True, options={"current_first": False}
    )

    # Then its hits carry the mark; off, the messages come as they are, both kept
    assert found.results[0].kind == "fact" and found.results[0].extra["held"] == "since 2024-05"
    assert [hit.extra.get("held") for hit in found.results[1:]] == [None, "2023-01-10 to 2024-05"]
    assert "Ana moved to Berlin (since 2024-05)" in found.context
    assert [hit.kind for hit in plain.results] == ["chunk", "chunk"]
    assert not any("held" in hit.extra for hit in plain.results)


def test_kenning_recall_on_the_command_line(memory: Kenning) -> None:
    # When recalled on the command line, now and as of 2023
    now = CliRunner().invoke(main, ["recall", QUESTION, "--dataset", "ana"])
    then = CliRunner().invoke(main, ["recall", QUESTION, "--dataset", "ana", "--as-of", "2023-06-01"])

    # Then the current fact is first, and the old message says when it held and what holds now
    assert now.exit_code == 0, now.output
    lines = now.output.splitlines()
    assert "(graph" in lines[0] and lines[0].endswith("Ana moved to Berlin (since 2024-05)")
    assert "Berlin last month" in lines[1] and "Oslo" in lines[2]
    assert lines[3].strip() == "held 2023-01-10 to 2024-05; now: Ana moved to Berlin (since 2024-05)"
    assert then.exit_code == 0, then.output
    first, *_ = then.output.splitlines()
    assert first.endswith("Ana live in Oslo (2023-01-10 to 2024-05)")
    assert "held since 2024-05; then: Ana live in Oslo (2023-01-10 to 2024-05)" in then.output
