"""`kenning search --session` is a search of the session, as over HTTP and in Python: its LLM
requests are the session's spend, its record is touched, and its answer is kept as an entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kenning.workers.cli.main import main
from tests.integration.test_session_surfaces import QUESTION, TEXT, calls, cli, home, simulator
from tests.simulator import Simulator

__all__ = ["home", "simulator"]  # the fixtures, shared with the session surfaces' tests


def run(*args: str) -> Any:
    done = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return done.output


def test_a_command_line_search_in_a_session_is_the_sessions(home: Path, simulator: Simulator) -> None:
    # Given a dataset added and cognified from the command line
    folder = home.parent / "corpus"
    folder.mkdir()
    (folder / "curie.txt").write_text(TEXT)
    run("add", str(folder), "--dataset", "science")
    run("cognify", "--dataset", "science")
    before = calls(simulator)
    # When a question is answered in a session
    args = ["--type", "RAG_COMPLETION", "--dataset", "science", "--session", "cli", "--json"]
    searched = json.loads(run("search", QUESTION, *args))
    assert searched["answer"]
    # Then the session's record shows what the provider billed for it
    spent = tuple(now - then for now, then in zip(calls(simulator), before, strict=True))
    shown = cli("session", "show", "cli")
    record = shown["session"]
    assert spent[0] >= 1
    assert (record["llm_calls"], record["tokens_in"], record["tokens_out"]) == spent
    assert record["state"] == "running"
    # And the answer is kept in the session, citing the dataset it read
    [entry] = shown["entries"]
    assert (entry["question"], entry["answer"]) == (QUESTION, searched["answer"])
    assert entry["datasets"] == ["science"]


def test_a_search_on_a_query_worker_takes_no_session(home: Path) -> None:
    done = CliRunner().invoke(main, ["search", "q", "--remote", "--session", "s"])
    assert done.exit_code == 2 and "--session searches here: leave out --remote" in done.output
