"""The QA harness runs end to end against the project's LLM simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.qa import DATA, SETS, evaluate, exact_match, token_f1
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator


def test_answer_scores() -> None:
    assert exact_match("The Eiffel Tower!", "eiffel tower") == 1.0
    assert exact_match("Paris, France", "Paris") == 0.0
    assert token_f1("Paris, France", "Paris") == pytest.approx(2 / 3)
    assert token_f1("", "Paris") == 0.0


@pytest.mark.skipif(
    not (DATA / "hotpotqa_100").exists(), reason="../shared/data is not beside the repository"
)
@pytest.mark.parametrize("name", ["hotpotqa", "cognee_hotpot"])
def test_harness_scores_every_question_with_the_simulator(name: str, tmp_path: Path) -> None:
    with Simulator() as simulator:
        settings = load_settings(
            home=tmp_path, embedding_provider="hash", llm_url=simulator.base_url, llm_api_key="test"
        )
        figures = evaluate(settings, name, 2, "GRAPH_COMPLETION", documents=20)
        chat_calls = simulator.stats()["calls"]["chat"]
    rows: list[dict[str, Any]] = figures["rows"]  # type: ignore[assignment]
    # Every question of the set was asked, and scored against its own gold answer
    _, pairs = SETS[name](2)
    assert [(row["question"], row["gold"]) for row in rows] == pairs
    assert all(row["answer"] for row in rows) and chat_calls >= 2
    for row in rows:
        assert row["em"] == exact_match(row["answer"], row["gold"])
        assert row["f1"] == token_f1(row["answer"], row["gold"])
    # and the set's figures are the means over those questions
    assert figures["questions"] == 2
    assert figures["exact_match"] == round(sum(row["em"] for row in rows) / 2, 4)
    assert figures["f1"] == round(sum(row["f1"] for row in rows) / 2, 4)
