"""Facts that change, on the workers: each message its own extraction batch, so each is loaded by a
load part of its own, and the facts are settled under the dataset's write lock; remembering the
conversation again (a redelivery of the same work) and a forget by task name, as embedded."""

from __future__ import annotations

import uuid

import pytest

from kenning.pipeline.models import GraphEdge
from kenning.workers.memory import Kenning
from tests.integration.cluster import Deployment, Workers
from tests.integration.test_memory_distributed import Client

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(360)]

CONVERSATION = [
    {"speaker": "Ana", "text": "I live in Oslo and work for Norsk Data.", "time": "2023-01-10T09:00:00"},
    {"speaker": "Ana", "text": "I moved to Berlin.", "time": "2024-06-02T10:00:00"},
    {"speaker": "Ana", "text": "I no longer work for Norsk Data.", "time": "2024-07-01T08:00:00"},
]


@pytest.fixture
def shared() -> dict[str, str]:
    """One message per extraction batch: each is loaded by a load part of its own."""
    return {"tenant": f"t-{uuid.uuid4().hex[:8]}", "embedding_provider": "hash", "extract_batch": "1"}


def facts(deployment: Deployment) -> dict[str, tuple[bool, list[tuple[str, str | None]]]]:
    with Kenning(deployment.settings) as memory:
        found = memory.history("Ana", "ana")
    return {
        f"{f.relationship} {f.target}": (f.current, [(p.valid_from, p.valid_to) for p in f.periods])
        for f in found
    }


def edges(deployment: Deployment) -> list[GraphEdge]:
    with Kenning(deployment.settings) as memory:
        return sorted(memory.wiring.graph.export(memory.scope("ana"))[1], key=lambda edge: edge.id)


def test_facts_retire_across_load_parts_and_again_change_nothing(
    deployment: Deployment, worker: Workers, client: Client
) -> None:
    # Given a conversation remembered by task name, its messages loaded by parts of their own
    reply = client.call("kenning.remember", {"dataset": "ana", "messages": CONVERSATION}, "pipeline")
    run = client.follow(reply["run_id"])
    assert run["status"] == "completed" and run["stats"].get("streamed_chunks"), worker.logs()

    # Then each later message ended what it contradicts, as the embedded runner does
    expected = {
        "live_in Oslo": (False, [("2023-01-10T09:00:00Z", "2024-06-02T10:00:00Z")]),
        "work_for Norsk Data": (False, [("2023-01-10T09:00:00Z", "2024-07-01T08:00:00Z")]),
        "moved_to Berlin": (True, [("2024-06-02T10:00:00Z", None)]),
        "no_longer_work_for Norsk Data": (True, [("2024-07-01T08:00:00Z", None)]),
    }
    assert facts(deployment) == expected
    before = edges(deployment)

    # When the same conversation is remembered again and its run loaded again
    again = client.call("kenning.remember", {"dataset": "ana", "messages": CONVERSATION}, "pipeline")
    assert client.follow(again["run_id"])["status"] == "completed", worker.logs()

    # Then nothing changed
    assert edges(deployment) == before

    # When the message of the move is forgotten by task name
    forgotten = client.call("kenning.forget", {"dataset": "ana", "data_ids": [reply["item_ids"][1]]}, "load")
    assert forgotten["items"] == [reply["item_ids"][1]], worker.logs()

    # Then Oslo holds again
    after = facts(deployment)
    assert (
        after["live_in Oslo"] == (True, [("2023-01-10T09:00:00Z", None)]) and "moved_to Berlin" not in after
    )
