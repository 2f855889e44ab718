"""Every operation with a session (search, recall, remember) leaves a record of it, with the LLM
requests, tokens and cost the provider billed for it, its errors and its usage per model; `kenning
session list|show|end` and `GET /v1/sessions` show them with their state now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kenning.pipeline.models import utcnow
from kenning.storage.metadata.session_records import SqlSessionRecords
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.cluster import ROOT
from tests.simulator import Simulator

TEXT = "Marie Curie won the Nobel Prize in Physics in 1903 with Pierre Curie."
QUESTION = "Who won the Nobel Prize in Physics in 1903?"
ENV = {
    "KENNING_EMBEDDING_PROVIDER": "hash",
    "KENNING_LLM_API_KEY": "test",
    "KENNING_LLM_PRICE_PROMPT_PER_1K": "0.15",
    "KENNING_LLM_PRICE_COMPLETION_PER_1K": "0.6",
}


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with Simulator() as running:
        yield running


@pytest.fixture
def home(tmp_path: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_LLM_URL", simulator.base_url)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    return tmp_path / "home"


def calls(simulator: Simulator) -> tuple[int, int, int]:
    stats = simulator.stats()
    return stats["calls"]["chat"], stats["prompt_tokens"], stats["completion_tokens"]


def cli(*args: str) -> Any:
    done = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return json.loads(done.output)


def command(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "kenning.workers.cli", *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_search_recall_and_remember_each_leave_a_record_of_what_they_spent(
    home: Path, simulator: Simulator
) -> None:
    with Kenning(load_settings()) as memory:
        memory.add_text(TEXT, "science")
        memory.cognify("science")
        # When a session searches twice (an answer each), recalls, and remembers a message
        before = calls(simulator)
        memory.search(QUESTION, "RAG_COMPLETION", datasets=["science"], session_id="agent")
        memory.search(QUESTION, "GRAPH_COMPLETION_COT", datasets=["science"], session_id="agent")
        spent = tuple(now - then for now, then in zip(calls(simulator), before, strict=True))
        memory.recall("Curie", ["science"], session_id="recalled")
        memory.remember("Pierre Curie was Marie's husband.", "science", session_id="remembered")
    # Then each session has a record, and the one that searched shows what the provider billed
    listed = {s["session_id"]: s for s in cli("session", "list")["sessions"]}
    assert set(listed) == {"agent", "recalled", "remembered"}
    agent = listed["agent"]
    assert (agent["llm_calls"], agent["tokens_in"], agent["tokens_out"]) == spent
    assert agent["llm_calls"] >= 2 and agent["tokens_in"] > 0
    assert agent["cost"] == pytest.approx(spent[1] / 1000 * 0.15 + spent[2] / 1000 * 0.6, abs=1e-6)
    assert list(agent["models"]) == ["gpt-4o-mini"] and agent["models"]["gpt-4o-mini"]["calls"] == spent[0]
    assert all(s["state"] == "running" for s in listed.values())
    # And the remembered message's cognify, made with the simulator, is that session's spend
    assert listed["remembered"]["llm_calls"] >= 1
    # And `show` gives the same record, and the entries
    shown = cli("session", "show", "agent")
    assert shown["session"] == agent
    assert [entry["question"] for entry in shown["entries"]] == [QUESTION, QUESTION]


def test_an_operation_that_failed_is_counted_as_an_error_of_its_session(
    home: Path, simulator: Simulator
) -> None:
    with Kenning(load_settings()) as memory:
        memory.add_text(TEXT, "science")
        memory.cognify("science")
        # When a search of the session fails (the endpoint refuses its question)
        simulator.fail_on = "Nobel"
        with pytest.raises(Exception, match="refus|reject"):
            memory.search(QUESTION, "RAG_COMPLETION", datasets=["science"], session_id="s")
    # Then its record counts the error, and says it; the request it sent is counted
    record = cli("session", "show", "s")["session"]
    assert record["errors"] == 1 and record["last_error"]
    assert record["llm_calls"] == 1


def test_the_state_of_a_session_is_shown_as_it_is_now(home: Path) -> None:
    # Given sessions last used a minute, 10 minutes and an hour ago, and one ended
    with Kenning(load_settings()) as memory:
        key = memory.session_key
        engine = memory.wiring.engine
        for session, ago in {"now": 1, "quiet": 10, "gone": 60, "done": 1}.items():
            SqlSessionRecords(engine, clock=lambda ago=ago: utcnow() - timedelta(minutes=ago)).touch(key(session))
    ended = CliRunner().invoke(main, ["session", "end", "done"], catch_exceptions=False)
    assert ended.exit_code == 0, ended.output
    # Then each is shown in its state
    states = {s["session_id"]: s["state"] for s in cli("session", "list")["sessions"]}
    assert states == {"now": "running", "quiet": "idle", "gone": "abandoned", "done": "ended"}


def test_showing_or_ending_a_session_that_does_not_exist_is_an_error(home: Path) -> None:
    with Kenning(load_settings()) as memory:
        memory.add_text(TEXT, "science")
    for args in (["session", "show", "nope"], ["session", "end", "nope"], ["session", "show", "nope", "--json"]):
        done = command(*args)
        assert done.returncode != 0, done.stdout
        assert done.stdout == ""
        assert done.stderr.strip().count("\n") == 0 and "nope" in done.stderr, done.stderr
