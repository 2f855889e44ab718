"""MCP inside the HTTP API: `/mcp` on the API's own port, through the SDK's client, behind the
same API keys as `/v1`, with the MCP session manager started by the API app's lifespan."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest

from kenning.pipeline.permission import Permission, User, issue_key
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.test_mcp import TOOLS, call, connected, served

ADA = "Ada Lovelace wrote the first program for the Analytical Engine."


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        yield memory


def key_for(memory: Kenning, name: str, grants: dict[str, list[Permission]]) -> str:
    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name=name)
    store.add_user(user)
    for dataset, permissions in grants.items():
        store.grant(user, dataset, permissions)
    token, key = issue_key(user)
    store.add_key(key)
    return token


def test_mcp_and_v1_share_one_port_and_one_set_of_keys(memory: Kenning) -> None:
    # Given the API app on a port of 127.0.0.1, and a writer of "notes" and a reader of "other"
    writer = key_for(memory, "ada", {"notes": [Permission.READ, Permission.WRITE]})
    reader = key_for(memory, "bob", {"other": [Permission.READ]})

    async def remember(url: str) -> dict[str, object]:
        async with connected(url, writer) as session:
            assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS
            return await call(session, "remember", data=ADA, dataset="notes")

    async def search_as_reader(url: str) -> dict[str, object]:
        async with connected(url, reader) as session:
            return await call(session, "search", query="first program", type="CHUNKS", datasets=["notes"])

    with served(create_app(memory)) as url:
        base = url.removesuffix("/mcp")
        # When the writer remembers a fact over MCP
        remembered = anyio.run(remember, url)
        # Then the same key finds it over /v1, on the same port
        found = httpx2.post(
            f"{base}/v1/search",
            json={"query": "first program", "type": "CHUNKS", "datasets": ["notes"]},
            headers={"Authorization": f"Bearer {writer}"},
        )
        assert found.status_code == 200 and ADA in found.text
        assert remembered["status"] == "completed"
        # And over MCP the reader of another dataset finds nothing of it
        assert anyio.run(search_as_reader, url)["results"] == []
        # And MCP without a key, or with an unknown one, is refused before any session starts
        for headers in ({}, {"Authorization": "Bearer kn_0000_wrong"}):
            refused = httpx2.post(url, json={}, headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        # And the API's own routes still answer as before
        assert httpx2.get(f"{base}/health").json() == {"status": "ok"}
        assert httpx2.get(f"{base}/v1/me").status_code == 401


def test_mcp_answers_each_time_the_app_is_started(memory: Kenning) -> None:
    # Given one API app, started, stopped and started again (as test clients and reloads do)
    token = key_for(memory, "ada", {"notes": [Permission.READ]})
    app = create_app(memory)

    async def tools(url: str) -> set[str]:
        async with connected(url, token) as session:
            return {tool.name for tool in (await session.list_tools()).tools}

    for _ in range(2):
        with served(app) as url:
            # Then each start has its own MCP session manager, and MCP answers
            assert anyio.run(tools, url) == TOOLS
