"""The MCP server through the SDK's own client: over stdio (`kenning mcp` as a child process)
and over streamable HTTP on 127.0.0.1, where every request is scoped by its API key."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from starlette.applications import Starlette

from kenning.pipeline.models import utcnow
from kenning.pipeline.permission import Caller, Permission, User, issue_key
from kenning.workers.application.lifecycle import Recalled
from kenning.workers.mcp.server import http_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

TOOLS = {"remember", "recall", "forget", "search", "history", "list_datasets", "status"}
ADA = "Ada Lovelace wrote the first program for the Analytical Engine."
GRACE = "Grace Hopper built the first compiler for a computer language."


def kenning_executable() -> str:
    """The `kenning` script of the interpreter running the tests."""
    return str(Path(sys.executable).parent / "kenning")


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; fails the test with the tool's message if it is an error."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content


def text_of(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def test_stdio_remember_recall_forget(tmp_path: Path) -> None:
    # Given `kenning mcp` started by the SDK's client, as an agent's host would start it
    env = {"KENNING_HOME": str(tmp_path / "home"), "KENNING_EMBEDDING_PROVIDER": "hash"}
    server = StdioServerParameters(command=kenning_executable(), args=["mcp"], env=env, cwd=str(tmp_path))

    async def scenario() -> None:
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            # When the agent lists the tools
            listed = await session.list_tools()
            # Then it sees the six, each with a description
            assert {tool.name for tool in listed.tools} == TOOLS
            assert all(tool.description for tool in listed.tools)

            # When it remembers two facts and recalls one
            ada = await call(session, "remember", data=ADA, dataset="notes")
            grace = await call(session, "remember", data=GRACE, dataset="notes")
            assert ada["status"] == grace["status"] == "completed"
            recalled = Recalled.model_validate(
                await call(session, "recall", query="Who built the first compiler?", datasets=["notes"])
            )
            # Then the hit cites the data item, document and chunk it came from
            best = recalled.results[0]
            assert best.source == "graph" and "Grace Hopper" in best.text
            assert best.data_id == grace["item_ids"][0]
            assert best.document_id and best.chunk_id

            # When it forgets that item
            forgotten = await call(session, "forget", dataset="notes", data_ids=grace["item_ids"])
            assert forgotten["items"] == grace["item_ids"]
            # Then recall finds nothing of it, and the other fact stays
            again = Recalled.model_validate(
                await call(session, "recall", query="Who built the first compiler?", datasets=["notes"])
            )
            assert all(hit.data_id != grace["item_ids"][0] for hit in again.results)
            assert not any("Hopper" in hit.text for hit in again.results)
            assert any(hit.data_id == ada["item_ids"][0] for hit in again.results)

            # And status, list_datasets and a mistake answer as an agent can read them
            listed_datasets = await call(session, "list_datasets")
            assert [d["name"] for d in listed_datasets["datasets"]] == ["notes"]
            status = await call(session, "status", dataset="notes")
            assert status["datasets"][0]["items"] == {"done": 1}
            missing = await session.call_tool("forget", {"dataset": "nowhere"})
            assert missing.is_error and "no dataset 'nowhere'" in text_of(missing)

    anyio.run(scenario)


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Kenning]:
    opened = Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash"))
    yield opened
    opened.close()


def user_with_key(memory: Kenning, name: str, grants: dict[str, list[Permission]]) -> tuple[User, str]:
    """A user of the memory's tenant with these grants, and a fresh key of its."""
    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name=name)
    store.add_user(user)
    for dataset, permissions in grants.items():
        store.grant(user, dataset, permissions)
    token, key = issue_key(user)
    store.add_key(key)
    return user, token


@contextmanager
def served(app: Starlette) -> Iterator[str]:
    """The app answering on a free port of 127.0.0.1 (in a thread), and its MCP URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the MCP app did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


@asynccontextmanager
async def connected(url: str, token: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx2.Timeout(60, read=300)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def test_http_tools_act_with_the_keys_permissions(memory: Kenning) -> None:
    # Given a writer of "notes" and a user who may read only "other"
    writer, writer_token = user_with_key(memory, "ada", {"notes": [Permission.READ, Permission.WRITE]})
    _, reader_token = user_with_key(memory, "bob", {"other": [Permission.READ]})

    async def scenario(url: str) -> None:
        # When the writer remembers and recalls over streamable HTTP
        async with connected(url, writer_token) as session:
            assert {tool.name for tool in (await session.list_tools()).tools} == TOOLS
            remembered = await call(session, "remember", data=ADA, dataset="notes")
            recalled = Recalled.model_validate(await call(session, "recall", query="first program"))
            # Then its recall cites what it remembered
            assert recalled.results[0].data_id == remembered["item_ids"][0]
            # And forgetting needs delete, which it lacks
            refused = await session.call_tool("forget", {"dataset": "notes"})
            assert refused.is_error and "delete on dataset 'notes' is not granted" in text_of(refused)

        # When the other user asks for the same
        async with connected(url, reader_token) as session:
            recalled = Recalled.model_validate(
                await call(session, "recall", query="first program", datasets=["notes"])
            )
            searched = await call(session, "search", query="first program", type="CHUNKS", datasets=["notes"])
            refused = await session.call_tool("remember", {"data": GRACE, "dataset": "notes"})
            listed = await call(session, "list_datasets")
        # Then it gets nothing, and is not told that "notes" exists
        assert recalled.results == [] and searched["results"] == []
        assert refused.is_error and "no dataset 'notes'" in text_of(refused)
        assert listed["datasets"] == [{"name": "other", "exists": False, "permissions": ["read"]}]

    with served(http_app(memory)) as url:
        anyio.run(scenario, url)
        # And a request without a key, with a wrong one, or with a revoked one is refused at once
        keys = memory.wiring.permissions.list_keys(writer.id)
        memory.wiring.permissions.revoke_key(keys[0].id, utcnow())
        for token in (None, "kn_0000_wrong", writer_token):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            answer = httpx2.post(url, json={}, headers=headers)
            assert answer.status_code == 401
            assert answer.headers["www-authenticate"] == "Bearer"


def test_http_key_check_is_pluggable(memory: Kenning) -> None:
    # Given an app whose keys another service checks
    def check(token: str) -> Caller | None:
        if token != "let-me-in":
            return None
        grants = {"shared": frozenset({Permission.READ})}
        return Caller(tenant=memory.settings.tenant, user="svc", grants=grants)

    async def scenario(url: str) -> list[dict[str, Any]]:
        async with connected(url, "let-me-in") as session:
            return list((await call(session, "list_datasets"))["datasets"])

    with served(http_app(memory, check)) as url:
        # When its caller lists datasets, then it sees its grant; a key that check refuses gets 401
        assert anyio.run(scenario, url) == [{"name": "shared", "exists": False, "permissions": ["read"]}]
        assert httpx2.post(url, json={}, headers={"Authorization": "Bearer kn_x_y"}).status_code == 401
