"""Facts an LLM says a newer fact ends, beside the offline rules (`kenning.pipeline.contradiction`),
embedded, with the project's LLM simulator: one call per entity a load batch gives new facts,
counted as every call is, idempotent, and undone by forgetting the fact that ended another."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.models import ChunkStatus
from kenning.pipeline.validity import Fact
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator, StartSimulator

ROVERS = "[2021-03-04] Ana Berg: I play for Celtic Rovers."
UNITED = "[2023-05-01] Ana Berg: I play for Harbour United."


@pytest.fixture
def simulator(start_simulator: StartSimulator) -> Simulator:
    return start_simulator()


def memory(home: Path, simulator: Simulator, **options: Any) -> Kenning:
    settings = load_settings(
        home=home, embedding_provider="hash", llm_url=simulator.base_url, llm_api_key="test", **options
    )
    return Kenning(settings)


@pytest.fixture
def kenning(tmp_path: Path, simulator: Simulator) -> Iterator[Kenning]:
    with memory(tmp_path / "home", simulator, facts_llm=True) as opened:
        yield opened


def facts(kenning: Kenning, entity: str, dataset: str) -> dict[str, Fact]:
    return {f"{f.relationship} {f.target}": f for f in kenning.history(entity, dataset)}


def chat_calls(simulator: Simulator) -> int:
    return int(simulator.stats()["calls"].get("chat", 0))


def test_a_team_change_no_rule_knows_is_ended_by_the_llm(kenning: Kenning, simulator: Simulator) -> None:
    # Given Ana played for one team, then for another (no rule says one plays for one team)
    first = kenning.remember(ROVERS, "ana").item_ids[0]
    before = chat_calls(simulator)
    second = kenning.remember(UNITED, "ana").item_ids[0]

    # Then the LLM was asked once about Ana (the teams have no other fact), besides the extraction
    assert chat_calls(simulator) - before == 2
    history = facts(kenning, "Ana Berg", "ana")
    rovers, united = history["play_for Celtic Rovers"], history["play_for Harbour United"]
    assert united.current and not rovers.current
    [held] = rovers.periods
    assert (held.valid_from, held.valid_from_by) == ("2021-03-04", first)
    assert (held.valid_to, held.valid_to_by, held.retired_by) == ("2023-05-01", second, united.id)
    assert held.retired_at == united.periods[0].recorded_at

    # And status counts every call the simulator answered, the judgment's too
    [status] = kenning.status("ana")
    assert status["llm_calls"] == chat_calls(simulator)

    # And reads answer from what holds now
    found = kenning.search(
        "Who does Ana Berg play for?", "GRAPH_COMPLETION", datasets=["ana"], only_context=True
    )
    assert "Harbour United" in found.context and "Celtic Rovers" not in found.context


def test_off_by_default_and_offline_nothing_is_asked(tmp_path: Path, simulator: Simulator) -> None:
    with memory(tmp_path / "home", simulator) as kenning:
        kenning.remember(ROVERS, "ana")
        before = chat_calls(simulator)
        kenning.remember(UNITED, "ana")
        assert chat_calls(simulator) - before == 1  # the extraction alone
        history = facts(kenning, "Ana Berg", "ana")
        assert history["play_for Celtic Rovers"].current and history["play_for Harbour United"].current


def test_loaded_in_the_other_order_the_later_fact_still_ends_the_earlier(kenning: Kenning) -> None:
    # Given the later message remembered first
    kenning.remember(UNITED, "ana")
    kenning.remember(ROVERS, "ana")

    # Then the periods are those of the texts' own times
    history = facts(kenning, "Ana Berg", "ana")
    rovers, united = history["play_for Celtic Rovers"], history["play_for Harbour United"]
    assert united.current and not rovers.current
    assert rovers.periods[0].valid_to == "2023-05-01" and rovers.periods[0].retired_by == united.id


def test_loading_again_asks_nothing_and_changes_nothing(kenning: Kenning, simulator: Simulator) -> None:
    kenning.remember(ROVERS, "ana")
    kenning.remember(UNITED, "ana")
    scope = kenning.scope("ana")
    before = sorted(kenning.wiring.graph.export(scope)[1], key=lambda edge: edge.id)
    calls = chat_calls(simulator)

    # When every chunk is loaded again (a redelivered load)
    dataset = kenning.wiring.metadata.get_dataset(scope)
    assert dataset is not None
    chunks = kenning.wiring.chunks
    chunks.set_chunk_status(chunks.list_chunk_ids(dataset.id), ChunkStatus.EXTRACTED)
    run = kenning.cognify("ana")
    assert not run.stats.get("fact_judgments"), run.stats

    # Then nothing was asked (extractions are cached, statements judged) and no period changed
    assert chat_calls(simulator) == calls
    after = sorted(kenning.wiring.graph.export(scope)[1], key=lambda edge: edge.id)
    assert [edge.properties for edge in after] == [edge.properties for edge in before]


def test_forgetting_the_fact_that_ended_another_brings_it_back(kenning: Kenning) -> None:
    first = kenning.remember(ROVERS, "ana").item_ids[0]
    second = kenning.remember(UNITED, "ana").item_ids[0]
    assert not facts(kenning, "Ana Berg", "ana")["play_for Celtic Rovers"].current

    kenning.forget("ana", [second])

    history = facts(kenning, "Ana Berg", "ana")
    assert "play_for Harbour United" not in history
    rovers = history["play_for Celtic Rovers"]
    assert rovers.current and rovers.periods[0].valid_to is None and rovers.data_ids == [first]
    nodes, edges = kenning.wiring.graph.export(kenning.scope("ana"))
    assert second not in str([e.properties for e in edges])
