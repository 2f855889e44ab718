"""A search of several datasets is charged to each dataset it read (each one's `status` shows its
requests), and counted once wherever requests are summed over datasets: the total `kenning status`
shows, the search's own total and its session's, which equal what the provider (the simulator) saw."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator

PHYSICS = "Marie Curie won the Nobel Prize in Physics in 1903 with Pierre Curie."
CHEMISTRY = "Marie Curie won the Nobel Prize in Chemistry in 1911 for radium and polonium."
QUESTION = "Which Nobel Prizes did Marie Curie win?"
PRICES = {"llm_price_prompt_per_1k": 0.15, "llm_price_completion_per_1k": 0.6}


@pytest.fixture
def simulator() -> Iterator[Simulator]:
    with Simulator() as running:
        yield running


@pytest.fixture
def home(tmp_path: Path, simulator: Simulator, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    environment = {
        "KENNING_HOME": str(home),
        "KENNING_LLM_URL": simulator.base_url,
        "KENNING_LLM_API_KEY": "test",
        "KENNING_EMBEDDING_PROVIDER": "hash",
        "KENNING_LLM_PRICE_PROMPT_PER_1K": str(PRICES["llm_price_prompt_per_1k"]),
        "KENNING_LLM_PRICE_COMPLETION_PER_1K": str(PRICES["llm_price_completion_per_1k"]),
    }
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return home


def billed(simulator: Simulator) -> tuple[int, int, int]:
    stats = simulator.stats()
    return stats["calls"]["chat"], stats["prompt_tokens"], stats["completion_tokens"]


def figures(entry: dict[str, Any]) -> tuple[int, int, int]:
    return entry["llm_calls"], entry["tokens"]["prompt"], entry["tokens"]["completion"]


def status() -> dict[str, Any]:
    done = CliRunner().invoke(main, ["status", "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return dict(json.loads(done.output))


def test_a_search_of_two_datasets_is_charged_to_each_and_counted_once(
    home: Path, simulator: Simulator
) -> None:
    # Given two datasets cognified, each status equal to what its extraction cost
    with Kenning(load_settings()) as memory:
        memory.add_text(PHYSICS, "physics")
        memory.add_text(CHEMISTRY, "chemistry")
        memory.cognify("physics")
        memory.cognify("chemistry")
        extraction = {entry["dataset"]: figures(entry) for entry in memory.status()}
        assert tuple(map(sum, zip(*extraction.values(), strict=True))) == billed(simulator)
        before = billed(simulator)
        # When one search reads both, in a session
        answered = memory.search(
            QUESTION, "RAG_COMPLETION", datasets=["physics", "chemistry"], session_id="both"
        )
        assert answered.answer
        search = tuple(now - then for now, then in zip(billed(simulator), before, strict=True))
        assert search[0] >= 1
        record = memory.session_summary("both")
    # Then each dataset it read is charged its requests, as completions
    shown = status()
    by_name = {entry["dataset"]: entry for entry in shown["datasets"]}
    for name in ("physics", "chemistry"):
        entry = by_name[name]
        completion = entry["spend"]["completion"]
        assert (
            completion["llm_calls"],
            completion["tokens"]["prompt"],
            completion["tokens"]["completion"],
        ) == search
        assert figures(entry) == tuple(a + b for a, b in zip(extraction[name], search, strict=True))
    # And the total over the datasets counts each request once: what the provider saw, priced
    total = shown["total"]
    assert figures(total) == billed(simulator)
    prompt, completion = billed(simulator)[1:]
    assert total["cost"] == pytest.approx((prompt * 0.15 + completion * 0.6) / 1000)
    # And the session counts the search's requests once
    assert (record.llm_calls, record.tokens_in, record.tokens_out) == search
    # And the table's last row is that total
    table = CliRunner().invoke(main, ["status"], catch_exceptions=False).output
    [row] = [line for line in table.splitlines() if " total " in line]
    assert f" {total['llm_calls']} " in row and f"{total['cost']:.4f}" in row, table
