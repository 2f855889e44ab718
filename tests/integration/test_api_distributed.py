"""`kenning serve --distributed`: cognify over HTTP runs on the Celery workers, followed the same way."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from kenning.pipeline.permission import Permission, User, issue_key
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.wiring import Wiring
from tests.integration.cluster import Deployment, Workers

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(300)]


@pytest.fixture
def served(deployment: Deployment, workers: Workers) -> Iterator[tuple[TestClient, dict[str, str]]]:
    settings = deployment.settings
    with Kenning(settings, Wiring(settings, distributed=True)) as memory:
        user = User(tenant=settings.tenant, name="ada")
        memory.wiring.permissions.add_user(user)
        memory.wiring.permissions.grant(user, "notes", [Permission.READ, Permission.WRITE])
        token, key = issue_key(user)
        memory.wiring.permissions.add_key(key)
        with TestClient(create_app(memory, distributed=True)) as client:
            yield client, {"Authorization": f"Bearer {token}"}


def test_cognify_over_http_runs_on_the_workers(served: tuple[TestClient, dict[str, str]]) -> None:
    client, auth = served
    texts = [f"Keeper number {n} lit the lamp at Harrow Point." for n in range(4)]
    assert client.post("/v1/add", headers=auth, json={"dataset": "notes", "texts": texts}).status_code == 200

    # When a run is enqueued and waited for
    waited = client.post("/v1/cognify?wait=true", headers=auth, json={"dataset": "notes"})

    # Then the workers did it, and the run says so
    assert waited.status_code == 200 and waited.json()["status"] == "completed", waited.text
    assert waited.json()["stats"]["chunks_to_extract"] == 4

    # And a run enqueued without waiting streams its counters until it ends
    client.post("/v1/add", headers=auth, json={"dataset": "notes", "texts": ["Iris Vale kept the log."]})
    started = client.post("/v1/cognify", headers=auth, json={"dataset": "notes"})
    assert started.status_code == 202
    with client.stream("GET", f"/v1/runs/{started.json()['id']}/events", headers=auth) as stream:
        data = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
    assert data[-1]["status"] == "completed" and data[-1]["stats"]["chunks_to_extract"] == 1
