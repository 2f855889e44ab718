"""A cognify against a server that does not take json_schema, and a model that does not list every
fact's end: every chunk is extracted, no fact is lost, and `status` says how and what was repaired."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kenning.pipeline.checks import ENTITIES_FROM_FACTS
from kenning.workers.cli.main import main
from tests.simulator import Simulator

TEXTS = {
    "curie.txt": "Marie Curie won the Nobel Prize in Physics in 1903 with Pierre Curie.",
    "bohr.txt": "Niels Bohr founded the Institute for Theoretical Physics in Copenhagen.",
}


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    # llama-cpp-python's answer to json_schema, and a small model's habit of naming ends unlisted
    with Simulator(accepts="json_object", unlisted_ends=True) as running:
        yield running


@pytest.fixture
def corpus(tmp_path: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("KENNING_LLM_URL", simulator.base_url)
    monkeypatch.setenv("KENNING_LLM_MAX_RETRIES", "4")
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name, text in TEXTS.items():
        (folder / name).write_text(text)
    return folder


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def status() -> dict[str, Any]:
    found: dict[str, Any] = json.loads(invoke("status", "--dataset", "science", "--json").output)
    return found


def test_a_run_against_a_json_object_server_extracts_every_chunk_and_keeps_every_fact(
    corpus: Path, simulator: Simulator
) -> None:
    invoke("add", str(corpus), "--dataset", "science")

    invoke("cognify", "--dataset", "science")

    shown = status()
    entry = shown["datasets"][0]
    run = entry["runs"][0]
    # Every chunk extracted: one refusal moved the ladder down once, and no call was retried
    assert entry["failed_chunks"] == [] and run["status"] == "completed"
    # (units sent at once may each be refused before the first refusal moves the ladder)
    refused = simulator.stats()["format_refused"]
    assert 1 <= refused <= len(TEXTS)
    assert simulator.stats()["calls"]["chat"] == len(TEXTS) + refused
    # The rung is shown, and the facts' unlisted ends were kept as entities, counted
    assert shown["llm"]["structured_output"] == "json_object"
    assert run["stats"][ENTITIES_FROM_FACTS] > 0
    assert run["stats"].get("facts_dropped", 0) == 0
    found = json.loads(
        invoke("search", "Copenhagen", "--dataset", "science", "--type", "CHUNKS_LEXICAL", "--json").output
    )
    assert found["results"]


def test_status_shows_the_rung_and_the_repairs_in_words(corpus: Path) -> None:
    invoke("add", str(corpus), "--dataset", "science")
    invoke("cognify", "--dataset", "science")

    output = invoke("status", "--dataset", "science").output

    assert "structured output json_object" in output
    assert "fact ends repaired" in output


def test_a_forced_rung_is_shown_as_forced(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_LLM_STRUCTURED", "prompt")
    invoke("add", str(corpus), "--dataset", "science")

    shown = json.loads(invoke("status", "--json").output)
    assert shown["llm"]["structured_output"] == "prompt (forced)"
