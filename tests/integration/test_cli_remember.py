"""`kenning remember`: the ids of what it made, the progress `cognify` shows, each failed item with
its reason, conversations from JSON, and a session write that returns before the graph is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kenning.pipeline.locking import held, lock_name
from kenning.workers.application.lifecycle import Message
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.cli_runner import Cli, one_error_line

CONVERSATION = [
    {"role": "user", "content": "My cat Oliver likes the lighthouse.", "time": "2024-05-01T10:00:00+00:00"},
    {"role": "assistant", "content": "Oliver sounds adventurous.", "time": "2024-05-01T10:00:05+00:00"},
]


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    monkeypatch.chdir(tmp_path)
    return Cli(monkeypatch, capsys)


def printed_ids(out: str) -> list[str]:
    return [line.split("\t")[0] for line in out.splitlines()]


def items(dataset: str) -> dict[str, tuple[str, str]]:
    """The dataset's items: id -> (status, error)."""
    with Kenning(load_settings()) as memory:
        found = memory.wiring.metadata.list_items(memory.dataset(dataset).id)
    return {item.id: (item.status.value, item.error) for item in found}


def test_remember_prints_the_ids_it_made_with_the_progress_of_cognify(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("Ada Lovelace wrote the first program.")
    code, out, err = cli("remember", "note.txt", "--dataset", "notes")
    assert code == 0
    assert [line.split("\t")[1] for line in out.splitlines()] == ["note.txt"]
    assert printed_ids(out) == list(items("notes"))
    # The bars of the pipeline's steps, as cognify draws them, and the run's line
    assert all(step in err for step in ("classify", "chunk", "extract", "load")) and "completed" in err


def test_remember_names_each_item_that_failed_and_why(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("Grace Hopper built the first compiler.")
    (tmp_path / "empty.txt").write_text("")
    code, out, err = cli("remember", "good.txt", "empty.txt", "--dataset", "notes")
    assert code == 1
    made = items("notes")
    assert sorted(printed_ids(out)) == sorted(made)
    failed = [item_id for item_id, (status, _) in made.items() if status == "failed"]
    assert len(failed) == 1 and f"failed empty.txt ({failed[0]}): empty file" in err


def test_remember_takes_a_conversation_as_json(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "chat.json").write_text(json.dumps(CONVERSATION))
    code, out, _ = cli("remember", "--messages", "chat.json", "--dataset", "chat")
    assert code == 0 and len(printed_ids(out)) == 2 and set(printed_ids(out)) == set(items("chat"))
    # And each message is recalled with its speaker and time
    code, out, _ = cli("recall", "Oliver", "--dataset", "chat", "--type", "CONVERSATION", "--json")
    speakers = {hit["speaker"] for hit in json.loads(out)["results"]}
    assert code == 0 and speakers == {"user", "assistant"}


def test_remember_takes_a_conversation_on_stdin_and_says_what_is_wrong_with_one(cli: Cli) -> None:
    code, out, _ = cli("remember", "--messages", "-", "--dataset", "chat", stdin=json.dumps(CONVERSATION[:1]))
    assert code == 0 and len(printed_ids(out)) == 1
    bad = json.dumps([CONVERSATION[0], {"role": "user", "time": "2024-05-01"}])
    code, _, err = cli("remember", "--messages", "-", "--dataset", "chat", stdin=bad)
    assert code == 2 and one_error_line(err) == "error: stdin: message 2: no text (or content)"


def test_a_binary_file_is_refused_from_a_session_and_latin_1_text_is_read(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "photo.bin").write_bytes(bytes(range(256)) * 4)
    code, _, err = cli("remember", "photo.bin", "--session", "s", "--dataset", "chat")
    assert code == 2 and "photo.bin: binary content, not text" in one_error_line(err)
    (tmp_path / "old.txt").write_bytes("Le caf\xe9 du port ferme \xe0 midi.".encode("latin-1"))
    code, _, _ = cli("remember", "old.txt", "--session", "s", "--dataset", "chat")
    assert code == 0
    with Kenning(load_settings()) as memory:
        said = [entry.question for entry in memory.get_session("s")]
    assert said == ["Le café du port ferme à midi."]


def test_remember_in_a_session_returns_before_the_graph_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    env, settings = dict(os.environ), load_settings()
    with Kenning(settings) as memory:
        memory.add_text("The lighthouse was lit in 1822.", "chat")
        # Given the dataset's lock held, so no cognify of it can start
        with held(memory.wiring.lock, lock_name(memory.scope("chat")), 60):
            # When a message is remembered in a session
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kenning.workers.cli",
                    "remember",
                    "-",
                    "--session",
                    "s",
                    "--dataset",
                    "chat",
                ],
                input=b"Melanie's cat is called Oliver.",
                env=env,
                capture_output=True,
                timeout=120,
                check=False,
            )
            # Then it returned with the id of the item the message is, already added
            assert done.returncode == 0, done.stderr
            (made,) = printed_ids(done.stdout.decode())
            assert items("chat")[made] == ("pending", "")
            # And the session has the message
            assert [entry.question for entry in memory.get_session("s")][
                -1
            ] == "Melanie's cat is called Oliver."
        # When the lock is let go, the process left behind builds its graph
        deadline = time.monotonic() + 120
        while items("chat")[made][0] not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert items("chat")[made] == ("done", "")


def test_the_graph_write_left_behind_does_not_undo_a_forget(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    message = [Message(text="Melanie's cat is called Oliver.")]
    with Kenning(settings) as memory:
        # Given a message remembered in a session, its graph write left to another process
        memory.add_text("The lighthouse was lit in 1822.", "chat")
        done = memory.remember(message, "chat", "s", detached=True)
        # When its item is forgotten before that process gets to it
        memory.forget("chat", done.item_ids)
        # Then the graph write finds nothing to do, and brings nothing back
        memory.make_memory(message, "chat", "s", added=True)
        remaining = memory.wiring.metadata.list_items(memory.dataset("chat").id)
        assert [item.id for item in remaining if item.id in done.item_ids] == []
        assert all(
            "Oliver" not in hit.text for hit in memory.search("cat", "CHUNKS", datasets=["chat"]).results
        )
