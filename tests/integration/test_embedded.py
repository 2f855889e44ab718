"""Embedded mode through the CLI and the Python API: SQLite, SQL graph, Qdrant local mode, no servers."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import kenning.workers.memory
from kenning.pipeline.errors import ConfigError
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

HOSTILE = "'}) DETACH DELETE n //"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    return tmp_path


def invoke(*args: str, stdin: str | None = None) -> Result:
    result = CliRunner().invoke(main, list(args), input=stdin, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "curie.md").write_text("# Marie Curie\n\nMarie Curie won the Nobel Prize in Physics in 1903.")
    (folder / "bohr.txt").write_text(
        "Niels Bohr founded the Institute for Theoretical Physics in Copenhagen."
    )
    (folder / "empty.txt").write_text("")
    (folder / "hostile.txt").write_text(f"Ada Lovelace met {HOSTILE} Somebody in London.")
    return folder


def test_add_cognify_search_status_through_the_cli(env: Path) -> None:
    corpus = write_corpus(env / "corpus")
    added = invoke("add", str(corpus), "--dataset", "science")
    assert "added 4" in added.output
    again = invoke("add", str(corpus), "--dataset", "science")
    assert "added 0, unchanged 4" in again.output

    # The empty file fails alone: the run says so and the CLI exits non-zero
    cognified = CliRunner().invoke(main, ["cognify", "--dataset", "science"], catch_exceptions=False)
    assert cognified.exit_code == 1 and "completed_with_errors" in cognified.output

    found = invoke("search", "Who won the Nobel Prize?", "--type", "CHUNKS", "--dataset", "science", "--json")
    payload = json.loads(found.output)
    assert set(payload) >= {"query", "type", "results", "context", "answer"}
    assert payload["answer"] is None and payload["type"] == "CHUNKS"
    top = payload["results"][0]
    assert "Marie Curie" in top["text"] and top["document_id"] and top["chunk_id"] and top["score"] >= 0

    graph = json.loads(
        invoke(
            "search",
            "Niels Bohr",
            "--type",
            "GRAPH_COMPLETION",
            "--dataset",
            "science",
            "--only-context",
            "--json",
        ).output
    )
    assert graph["type"] == "GRAPH_COMPLETION" and "Niels Bohr" in graph["context"]

    status = json.loads(invoke("status", "--dataset", "science", "--json").output)["datasets"][0]
    assert status["items"] == {"done": 3, "failed": 1}
    assert "empty" in status["errors"]["empty.txt"]
    assert status["graph"]["nodes"] > 0 and status["runs"][0]["status"] == "completed_with_errors"


def test_add_reads_stdin(env: Path) -> None:
    invoke("add", "-", stdin="Grace Hopper wrote the first compiler.")
    invoke("cognify")
    payload = json.loads(invoke("search", "compiler", "--type", "CHUNKS", "--json").output)
    assert "Grace Hopper" in payload["results"][0]["text"]


def test_hostile_entity_name_is_stored_verbatim_in_the_sql_graph(env: Path) -> None:
    settings = load_settings(home=env / "home", embedding_provider="hash")
    with Kenning(settings) as memory:
        memory.add_text(f"Ada Lovelace met {HOSTILE} Somebody in London.")
        memory.add_text("Charles Babbage built the Difference Engine.", name="second")
        memory.cognify()
        nodes, edges = memory.wiring.graph.export(memory.scope())
    texts = [str(node.properties.get("text", "")) for node in nodes]
    assert any(HOSTILE.strip() in text for text in texts)
    assert "Charles Babbage" in {node.properties.get("name") for node in nodes}
    assert edges


def test_unknown_backend_is_a_startup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_GRAPH_BACKEND", "neptune")
    with pytest.raises(ConfigError, match="KENNING_GRAPH_BACKEND"):
        load_settings()


def test_cypher_backend_without_url_is_a_startup_error() -> None:
    with pytest.raises(ConfigError, match="KENNING_GRAPH_URL"):
        load_settings(graph_backend="falkordb")


def test_vector_size_mismatch_is_an_error_not_an_empty_result(env: Path) -> None:
    home = env / "home"
    with Kenning(load_settings(home=home, embedding_provider="hash", embedding_dimension=384)) as memory:
        memory.add_text("Rosalind Franklin photographed DNA.")
        memory.cognify()
    with Kenning(load_settings(home=home, embedding_provider="hash", embedding_dimension=128)) as memory:
        with pytest.raises(Exception, match="384"):
            memory.search("DNA", "CHUNKS")


def test_the_python_api_docstring_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    home = {"tmp_home": tmp_path / "doc"}
    results = doctest.testmod(kenning.workers.memory, extraglobs=home, verbose=False)
    assert results.attempted > 0 and results.failed == 0


def test_fifty_megabyte_file_over_the_limit_fails_alone(env: Path) -> None:
    big = env / "big.txt"
    line = "The committee met in Geneva in 1998 and again in Vienna in 1999.\n"
    with big.open("w") as handle:
        for _ in range(50 * 2**20 // len(line) + 1):
            handle.write(line)
    small = env / "small.txt"
    small.write_text("Lise Meitner explained nuclear fission.")
    settings = load_settings(home=env / "home", embedding_provider="hash", max_document_bytes=8 * 2**20)
    with Kenning(settings) as memory:
        added = memory.add_paths([str(big), str(small)])
        run = memory.cognify()
        status = memory.status()[0]
    # The file over the cap is refused at add, read no further than the cap, and named with why
    assert [item.name for item in added.added] == ["small.txt"]
    assert "KENNING_MAX_DOCUMENT_BYTES" in added.errors[str(big)]
    assert run.status.value == "completed" and status["items"] == {"done": 1}


def test_an_llm_endpoint_extracts_and_answers(tmp_path: Path) -> None:
    # Given the project's LLM simulator as the OpenAI-compatible endpoint
    from tests.simulator import Simulator

    with Simulator() as simulator:
        settings = load_settings(
            home=tmp_path / "home", embedding_provider="hash", llm_url=simulator.base_url, llm_api_key="test"
        )
        with Kenning(settings) as memory:
            memory.add_text("Dorothy Hodgkin solved the structure of penicillin in 1945.")
            # When the dataset is cognified and searched with completion
            run = memory.cognify()
            result = memory.search("What did Dorothy Hodgkin solve?", "GRAPH_COMPLETION")
        calls = simulator.stats()["calls"]["chat"]
    # Then extraction went through the endpoint and an answer came back
    assert run.status.value == "completed" and run.stats["llm_calls"] == 1
    assert calls == 2
    assert result.answer and result.notice is None


def test_dry_run_estimates_calls_and_tokens_without_spending(tmp_path: Path) -> None:
    from tests.simulator import Simulator

    with Simulator() as simulator:
        settings = load_settings(
            home=tmp_path / "home",
            embedding_provider="hash",
            llm_url=simulator.base_url,
            llm_api_key="test",
            llm_price_prompt_per_1k=0.5,
            llm_price_completion_per_1k=1.5,
        )
        with Kenning(settings) as memory:
            memory.add_text("Dorothy Hodgkin solved the structure of penicillin in 1945.")
            memory.add_text("Dorothy Hodgkin solved the structure of penicillin in 1945. ", name="twin")
            memory.add_text("")
            # When the next run is estimated
            estimate = memory.estimate()
            spent_before_run = simulator.stats()["calls"]["chat"]
            memory.cognify()
            after = memory.estimate()
    # Then it counts the calls and tokens a run would spend, and spends nothing itself
    assert spent_before_run == 0
    assert estimate.items == 3 and estimate.unreadable_items == 1 and estimate.chunks == 2
    assert estimate.llm_calls == 1 and estimate.prompt_tokens > 0 and estimate.cost > 0
    assert after.llm_calls == 0 and after.items == 0


def test_a_dataset_the_caller_may_not_read_gives_nothing_and_no_error(tmp_path: Path) -> None:
    # Given tenant "acme" with a dataset of its own
    acme = load_settings(home=tmp_path / "home", embedding_provider="hash", tenant="acme")
    with Kenning(acme) as memory:
        memory.add_text("Acme's secret formula is blue paint.", "secrets")
        memory.cognify("secrets")
        assert memory.search("secret formula", "CHUNKS", datasets=["secrets"]).results
    # When another tenant asks for that dataset, acting as acme but allowed only its own scopes
    outsider = acme.model_copy(update={"tenant": "acme", "read_scopes": ["globex/*"]})
    with Kenning(outsider) as memory:
        for kind in ("CHUNKS", "GRAPH_COMPLETION", "HYBRID_COMPLETION"):
            result = memory.search("secret formula", kind, datasets=["secrets"], only_context=True)
            # Then nothing comes back, and nothing says the dataset exists
            assert result.results == [] and result.context == "" and result.notice is None
    # And a pattern that allows it reads it
    partner = acme.model_copy(update={"read_scopes": ["acme/sec*"]})
    with Kenning(partner) as memory:
        assert memory.search("secret formula", "CHUNKS", datasets=["secrets"]).results
