"""Tokens and cost per run and per dataset, embedded, with the LLM simulator as the endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kenning.workers.cli.main import main
from tests.simulator import Simulator

PROMPT_PRICE = 0.15
COMPLETION_PRICE = 0.6
TEXTS = {
    "curie.txt": "Marie Curie won the Nobel Prize in Physics in 1903 with Pierre Curie.",
    "bohr.txt": "Niels Bohr founded the Institute for Theoretical Physics in Copenhagen.",
}


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with Simulator() as running:
        yield running


@pytest.fixture
def corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("KENNING_LLM_PRICE_PROMPT_PER_1K", str(PROMPT_PRICE))
    monkeypatch.setenv("KENNING_LLM_PRICE_COMPLETION_PER_1K", str(COMPLETION_PRICE))
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name, text in TEXTS.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def online(corpus: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_LLM_URL", simulator.base_url)
    monkeypatch.setenv("KENNING_LLM_API_KEY", "test")
    return corpus


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def status_of(dataset: str) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads(invoke("status", "--dataset", dataset, "--json").output)["datasets"][0]
    return entry


def cost_of(tokens: dict[str, int]) -> float:
    return round(tokens["prompt"] / 1000 * PROMPT_PRICE + tokens["completion"] / 1000 * COMPLETION_PRICE, 6)


def test_a_run_reports_the_tokens_the_endpoint_billed_and_their_cost(
    online: Path, simulator: Simulator
) -> None:
    invoke("add", str(online), "--dataset", "science")

    invoke("cognify", "--dataset", "science")

    status = status_of("science")
    run = status["runs"][0]
    billed = simulator.stats()
    assert run["tokens"] == {"prompt": billed["prompt_tokens"], "completion": billed["completion_tokens"]}
    assert run["tokens"]["prompt"] > 0 and run["tokens"]["completion"] > 0
    assert run["cost"] == pytest.approx(cost_of(run["tokens"])) and run["cost"] > 0
    assert status["llm_calls"] == billed["calls"]["chat"] == len(TEXTS)
    assert status["tokens"] == run["tokens"] and status["cost"] == run["cost"]


def test_a_cached_rerun_adds_no_tokens_to_the_dataset(online: Path, simulator: Simulator) -> None:
    # Given a dataset extracted once, and a second dataset with the same texts
    invoke("add", str(online), "--dataset", "first")
    invoke("cognify", "--dataset", "first")
    spent = status_of("first")["tokens"]
    invoke("add", str(online), "--dataset", "second")

    # When the second is cognified, every extraction comes from the cache
    invoke("cognify", "--dataset", "second")

    # Then its run and its totals spent nothing, and the endpoint saw no new call
    second = status_of("second")
    assert second["runs"][0]["stats"]["cache_hits"] == len(TEXTS)
    assert second["runs"][0]["tokens"] == {"prompt": 0, "completion": 0}
    assert second["llm_calls"] == 0 and second["cost"] == 0
    assert simulator.stats()["prompt_tokens"] == spent["prompt"]


def test_offline_extraction_reports_no_tokens_and_no_cost(corpus: Path) -> None:
    invoke("add", str(corpus), "--dataset", "offline")

    invoke("cognify", "--dataset", "offline")

    status = status_of("offline")
    assert status["runs"][0]["status"] == "completed"
    assert status["runs"][0]["tokens"] == {"prompt": 0, "completion": 0}
    assert status["tokens"] == {"prompt": 0, "completion": 0} and status["cost"] == 0
    table = invoke("status", "--dataset", "offline").output
    assert "cost" in table and "0.0000" in table


def test_watch_on_a_finished_dataset_returns_with_its_status(corpus: Path) -> None:
    # Given a dataset whose only run has completed
    invoke("add", str(corpus), "--dataset", "done")
    invoke("cognify", "--dataset", "done")

    # When its runs are watched, there is nothing to wait for
    result = invoke("status", "--dataset", "done", "--watch", "--timeout", "30", "--json")

    # Then the status is printed as without --watch
    status = json.loads(result.stdout)["datasets"][0]
    assert status["dataset"] == "done" and status["runs"][0]["status"] == "completed"
