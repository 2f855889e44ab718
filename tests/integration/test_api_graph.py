"""The graph view over HTTP: `GET /v1/datasets/{name}/graph` is the page `kenning visualize` writes,
for a caller that may read the dataset, and 404 for any other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kenning.pipeline.permission import Permission, User, issue_key
from kenning.workers.api import create_app
from kenning.workers.control.graph_view import graph_html
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        memory.remember(
            "Ada Lovelace worked with Charles Babbage in London on the Analytical Engine.", "notes"
        )
        memory.remember("Grace Hopper built the first compiler in Philadelphia.", "secret")
        yield memory


def key_for(memory: Kenning, name: str, grants: dict[str, list[Permission]]) -> dict[str, str]:
    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name=name)
    store.add_user(user)
    for dataset, permissions in grants.items():
        store.grant(user, dataset, permissions)
    token, key = issue_key(user)
    store.add_key(key)
    return {"Authorization": f"Bearer {token}"}


def test_graph_page_for_a_reader_and_404_for_anyone_else(memory: Kenning) -> None:
    # Given a reader of "notes" (not of "secret") and a writer-only user of "notes"
    reader = key_for(memory, "ada", {"notes": [Permission.READ]})
    writer = key_for(memory, "bob", {"notes": [Permission.WRITE]})
    with TestClient(create_app(memory)) as client:
        # When the reader asks for the graph of "notes"
        page = client.get("/v1/datasets/notes/graph", headers=reader)
        # Then it gets the same page `kenning visualize` writes, as HTML
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert page.text == graph_html(memory, "notes")
        assert "Charles Babbage" in page.text and "Grace Hopper" not in page.text

        # And a smaller page when it asks for fewer entities
        sampled = client.get("/v1/datasets/notes/graph", params={"max_nodes": 1}, headers=reader)
        assert sampled.status_code == 200 and sampled.text == graph_html(memory, "notes", 1)

        # When it asks for a dataset it may not read, or one that does not exist,
        # or the writer asks, or nobody's key is sent
        denied = client.get("/v1/datasets/secret/graph", headers=reader)
        missing = client.get("/v1/datasets/nowhere/graph", headers=reader)
        unread = client.get("/v1/datasets/notes/graph", headers=writer)
        anonymous = client.get("/v1/datasets/notes/graph")
    # Then the first three are the same 404, with nothing of the page, and the last is 401
    for answer in (denied, missing, unread):
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "not_found"
    assert anonymous.status_code == 401
