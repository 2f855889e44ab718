"""Every operation with a session (search, recall, remember) leaves a record of it, with the LLM
requests, tokens and cost the provider billed for it, its errors and its usage per model; `kenning
session list|show|end` and `GET /v1/sessions` show them with their state now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from kenning.pipeline.models import utcnow
from kenning.pipeline.permission import Caller, Permission, User, issue_key
from kenning.storage.metadata.session_records import SqlSessionRecords
from kenning.workers.api import create_app
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.cluster import ROOT
from tests.integration.test_api_operations import sample
from tests.integration.test_mcp import call, connected, served
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


def stopped_at(moment: datetime) -> Callable[[], datetime]:
    """A clock that always reads `moment`."""
    return lambda: moment


def test_the_state_of_a_session_is_shown_as_it_is_now(home: Path) -> None:
    # Given sessions last used a minute, 10 minutes and an hour ago, and one ended
    with Kenning(load_settings()) as memory:
        key = memory.session_key
        engine = memory.wiring.engine
        for session, ago in {"now": 1, "quiet": 10, "gone": 60, "done": 1}.items():
            then = utcnow() - timedelta(minutes=ago)
            SqlSessionRecords(engine, clock=stopped_at(then)).touch(key(session))
    ended = CliRunner().invoke(main, ["session", "end", "done"], catch_exceptions=False)
    assert ended.exit_code == 0, ended.output
    # Then each is shown in its state
    states = {s["session_id"]: s["state"] for s in cli("session", "list")["sessions"]}
    assert states == {"now": "running", "quiet": "idle", "gone": "abandoned", "done": "ended"}


def test_showing_or_ending_a_session_that_does_not_exist_is_an_error(home: Path) -> None:
    with Kenning(load_settings()) as memory:
        memory.add_text(TEXT, "science")
    for args in (
        ["session", "show", "nope"],
        ["session", "end", "nope"],
        ["session", "show", "nope", "--json"],
    ):
        done = command(*args)
        assert done.returncode != 0, done.stdout
        assert done.stdout == ""
        assert done.stderr.strip().count("\n") == 0 and "nope" in done.stderr, done.stderr


def key_for(memory: Kenning, name: str) -> dict[str, str]:
    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name=name)
    store.add_user(user)
    store.grant(user, "science", list(Permission))
    token, key = issue_key(user)
    store.add_key(key)
    return {"Authorization": f"Bearer {token}"}


def test_the_api_lists_a_callers_sessions_with_what_they_spent(home: Path, simulator: Simulator) -> None:
    with Kenning(load_settings()) as memory, TestClient(create_app(memory)) as client:
        ada, bob = key_for(memory, "ada"), key_for(memory, "bob")
        memory.add_text(TEXT, "science")
        memory.cognify("science")
        # When ada searches with a session, and recalls with another from no dataset she may read
        before = calls(simulator)
        body = {"query": QUESTION, "type": "RAG_COMPLETION", "datasets": ["science"], "session_id": "s1"}
        assert client.post("/v1/search", json=body, headers=ada).status_code == 200
        spent = tuple(now - then for now, then in zip(calls(simulator), before, strict=True))
        recall = {"query": "Curie", "datasets": ["nowhere"], "session_id": "s2"}
        assert client.post("/v1/recall", json=recall, headers=ada).status_code == 200
        # Then her sessions are listed, the search's with what the provider billed for it
        listed = client.get("/v1/sessions", headers=ada).json()["sessions"]
        assert [s["session_id"] for s in listed] == ["s2", "s1"]
        s1 = listed[1]
        assert (s1["llm_calls"], s1["tokens_in"], s1["tokens_out"]) == spent and spent[0] == 1
        assert s1["state"] == "running" and s1["errors"] == 0
        assert client.get("/v1/sessions/s1/record", headers=ada).json() == s1
        # And bob sees none of them: his own list is empty, hers are not found for him
        assert client.get("/v1/sessions", headers=bob).json() == {"sessions": []}
        assert client.get("/v1/sessions/s1/record", headers=bob).status_code == 404
        assert client.post("/v1/sessions/s1/end", headers=bob).status_code == 404
        # And a session ended is shown ended
        assert client.post("/v1/sessions/s1/end", headers=ada).json() == {"ok": True}
        assert client.get("/v1/sessions/s1/record", headers=ada).json()["state"] == "ended"
        missing = client.get("/v1/sessions/nope/record", headers=ada)
        assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]


def test_mcp_searches_are_counted_and_its_recalls_recorded(home: Path, simulator: Simulator) -> None:
    with Kenning(load_settings()) as memory:
        token = key_for(memory, "ada")["Authorization"].removeprefix("Bearer ")
        memory.add_text(TEXT, "science")
        memory.cognify("science")
        before = calls(simulator)

        async def ask(url: str) -> dict[str, object]:
            async with connected(url, token) as session:
                await call(session, "recall", query="Curie", datasets=["science"], session_id="mcp")
                return await call(
                    session, "search", query=QUESTION, type="GRAPH_COMPLETION", datasets=["science"]
                )

        # When ada recalls in a session, then asks for an answer, over MCP
        with served(create_app(memory)) as url:
            answered = anyio.run(ask, url)
        assert answered["answer"]
        # Then the answer's request is the dataset's, as the provider billed it
        spent = tuple(now - then for now, then in zip(calls(simulator), before, strict=True))
        status = memory.status("science")[0]
        assert spent[0] == 1 and status["spend"]["completion"]["llm_calls"] == 1
        assert status["llm_calls"] == calls(simulator)[0]
        # And her recall left a record of its session
        ada = memory.as_caller(Caller(tenant=memory.settings.tenant, user="ada"))
        assert ada.session_summary("mcp").state == "running"


def test_metrics_count_the_requests_of_searches_as_completions(home: Path, simulator: Simulator) -> None:
    with Kenning(load_settings()) as memory, TestClient(create_app(memory)) as client:
        auth = key_for(memory, "ada")
        # When a dataset is cognified, then answered twice over HTTP
        memory.add_text(TEXT, "science")
        memory.cognify("science")
        for search_type in ("RAG_COMPLETION", "GRAPH_COMPLETION"):
            body = {"query": QUESTION, "type": search_type, "datasets": ["science"]}
            assert client.post("/v1/search", json=body, headers=auth).status_code == 200
        scraped = client.get("/metrics").text
    # Then the scrape counts the extraction's requests and the two answers, as the provider did
    extraction = sample(scraped, "kenning_llm_calls_total", purpose="extraction")
    completion = sample(scraped, "kenning_llm_calls_total", purpose="completion")
    assert (extraction, completion) == (1, 2) and extraction + completion == calls(simulator)[0]
    tokens = sum(
        sample(scraped, "kenning_llm_tokens_total", kind="prompt", purpose=purpose)
        for purpose in ("extraction", "completion")
    )
    assert tokens == calls(simulator)[1]


def test_the_command_lines_status_counts_its_searches_answers(home: Path, simulator: Simulator) -> None:
    # Given a dataset added and cognified from the command line
    folder = home.parent / "corpus"
    folder.mkdir()
    (folder / "curie.txt").write_text(TEXT)
    for args in (["add", str(folder), "--dataset", "science"], ["cognify", "--dataset", "science"]):
        assert CliRunner().invoke(main, args, catch_exceptions=False).exit_code == 0
    # When it answers a question twice, by two search types
    for search_type in ("RAG_COMPLETION", "GRAPH_COMPLETION_DECOMPOSITION"):
        cli("search", QUESTION, "--type", search_type, "--dataset", "science")
    # Then status shows what the provider billed, requests and tokens, the answers' apart
    status = cli("status", "--dataset", "science")["datasets"][0]
    assert (status["llm_calls"], status["tokens"]["prompt"], status["tokens"]["completion"]) == calls(
        simulator
    )
    assert status["spend"]["completion"]["llm_calls"] >= 3
