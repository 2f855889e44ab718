"""The real-model benchmark, pointed at the simulator: it keeps what it measured after each step,
so a long run stopped part way (a cognify of an hour, answers of minutes each) loses nothing."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench.real_llm import evaluate, main, samples
from tests.simulator import JSON, Simulator


def test_the_real_model_bench_saves_its_figures_after_the_cognify_and_after_each_type(tmp_path: Path) -> None:
    sources, questions = samples()
    saves: list[dict[str, Any]] = []
    with Simulator() as simulator:
        figures = evaluate(
            simulator.base_url,
            "samples",
            sources,
            questions[:1],
            tmp_path / "home",
            ["RAG_COMPLETION", "GRAPH_COMPLETION"],
            lambda figures: saves.append(copy.deepcopy(figures)),
        )
    # The first save holds the cognify's figures and no answers; each type adds its own
    assert [list(save["answers"]) for save in saves] == [
        [],
        ["RAG_COMPLETION"],
        ["RAG_COMPLETION", "GRAPH_COMPLETION"],
    ]
    assert saves[0]["extraction"]["extracted"] == saves[0]["extraction"]["chunks"] > 0
    assert saves[-1] == figures
    assert len(figures["answers"]["GRAPH_COMPLETION"]["rows"]) == 1


def bench_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[JSON, list[JSON]]:
    """The bench's report on the samples, run with `args` against the simulator, and the chat
    requests the simulator received."""
    out = tmp_path / "report.json"
    with Simulator() as simulator:
        monkeypatch.setenv("KENNING_REAL_LLM_URL", simulator.base_url)
        main(["--sets", "samples", *args, "--out", str(out)])
        requests = simulator.received()
    return json.loads(out.read_text()), requests


def test_the_real_model_bench_says_when_its_report_is_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, _ = bench_report(tmp_path, monkeypatch, "--types", "RAG_COMPLETION")
    assert report["complete"] is True
    assert report["sets"]["samples"]["answers"]["RAG_COMPLETION"]["errors"] == 0


def test_with_offline_extraction_the_model_only_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # When the bench runs with the offline extractor building the graph
    report, requests = bench_report(
        tmp_path, monkeypatch, "--types", "GRAPH_COMPLETION", "--extraction", "offline"
    )
    figures = report["sets"]["samples"]
    # Then every chunk was extracted with no LLM call, and the model was asked only for answers
    assert report["extraction"] == figures["extractor"] == "offline"
    assert figures["extraction"]["extracted"] == figures["extraction"]["chunks"] > 0
    assert figures["extraction"]["llm_calls"] == 0
    assert figures["answers"]["GRAPH_COMPLETION"]["errors"] == 0
    assert requests and not any("response_format" in body for body in requests)
