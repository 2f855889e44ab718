"""bench.changing_facts on a small world: the scores it prints are exact, and memory without
retirement (`piled_up`) scores far lower on the same answers."""

from __future__ import annotations

from pathlib import Path

from bench.changing_facts import run


def test_a_small_changing_world_is_answered_exactly(tmp_path: Path) -> None:
    result = run(people=12, seed=5, home=tmp_path / "home")
    assert result["run_status"] == "completed" and result["questions"]["current"] == 12 * 2 + 30
    assert result["current_accuracy"] >= 0.95 and result["as_of_accuracy"] >= 0.90
    assert result["history_completeness"] >= 0.90 and result["facts_retired"] > 0
    assert result["piled_up"]["current_accuracy"] < result["current_accuracy"] - 0.3
