"""Facts an LLM says a newer fact ends, on the workers (`kenning.pipeline.contradiction`): each
message loaded by a load part of its own, judged under the dataset's write lock, every call in
status, and remembering the conversation again asks nothing again."""

from __future__ import annotations

import uuid

import pytest

from kenning.pipeline.models import GraphEdge
from kenning.workers.memory import Kenning
from tests.integration.cluster import Deployment, Workers
from tests.integration.test_memory_distributed import Client
from tests.simulator import Simulator, StartSimulator

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(360)]

CONVERSATION = [
    {"speaker": "Ana Berg", "text": "I play for Celtic Rovers.", "time": "2021-03-04T09:00:00"},
    {"speaker": "Ana Berg", "text": "I play for Harbour United now.", "time": "2023-05-01T10:00:00"},
    {"speaker": "Ana Berg", "text": "I visited Lyon.", "time": "2023-06-01T08:00:00"},
]


@pytest.fixture
def simulator(start_simulator: StartSimulator) -> Simulator:
    return start_simulator()


@pytest.fixture
def shared(simulator: Simulator) -> dict[str, str]:
    """One message per extraction batch, and an LLM that is asked which facts a new one ends."""
    return {
        "tenant": f"t-{uuid.uuid4().hex[:8]}",
        "embedding_provider": "hash",
        "extract_batch": "1",
        "llm_url": simulator.base_url,
        "llm_api_key": "test",
        "facts_llm": "true",
    }


def edges(deployment: Deployment) -> list[GraphEdge]:
    with Kenning(deployment.settings) as memory:
        return sorted(memory.wiring.graph.export(memory.scope("ana"))[1], key=lambda edge: edge.id)


def test_the_llm_ends_a_fact_across_load_parts_and_again_asks_nothing(
    deployment: Deployment, worker: Workers, client: Client, simulator: Simulator
) -> None:
    # Given a conversation remembered by task name, its messages loaded by parts of their own
    reply = client.call("kenning.remember", {"dataset": "ana", "messages": CONVERSATION}, "pipeline")
    run = client.follow(reply["run_id"])
    assert run["status"] == "completed" and run["stats"].get("streamed_chunks"), worker.logs()

    # Then the later team ended the earlier one, by the LLM's judgment, as the embedded runner does
    with Kenning(deployment.settings) as memory:
        found = {f"{f.relationship} {f.target}": f for f in memory.history("Ana Berg", "ana")}
        [status] = memory.status("ana")
    rovers, united = found["play_for Celtic Rovers"], found["play_for Harbour United"]
    assert united.current and not rovers.current, worker.logs()
    assert (rovers.periods[0].valid_to, rovers.periods[0].retired_by) == ("2023-05-01T10:00:00Z", united.id)
    assert found["visited Lyon"].current
    calls = simulator.stats()["calls"]["chat"]
    assert run["stats"].get("fact_judgments", 0) >= 1 and status["llm_calls"] == calls, (run["stats"], calls)
    before = edges(deployment)

    # When the same conversation is remembered again
    again = client.call("kenning.remember", {"dataset": "ana", "messages": CONVERSATION}, "pipeline")
    assert client.follow(again["run_id"])["status"] == "completed", worker.logs()

    # Then nothing was asked and nothing changed
    assert simulator.stats()["calls"]["chat"] == calls
    assert edges(deployment) == before
