"""A session id means the same over MCP as over HTTP, in Python and on the command line: 1 to 80
printable ASCII characters, from one definition (`kenning.pipeline.session`), in the tools' schemas
and in what every surface accepts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from kenning.pipeline.errors import InputError
from kenning.pipeline.permission import User, issue_key
from kenning.workers.api import create_app
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.test_mcp import connected, served, text_of


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        yield memory


@pytest.fixture
def token(memory: Kenning) -> str:
    user = User(tenant=memory.settings.tenant, name="admin", admin=True)
    memory.wiring.permissions.add_user(user)
    token, key = issue_key(user)
    memory.wiring.permissions.add_key(key)
    return token


def string_option(schema: dict[str, Any]) -> dict[str, Any]:
    """The string branch of an optional argument's schema (`anyOf: [string, null]`)."""
    return next(option for option in schema["anyOf"] if option.get("type") == "string")


def http_session_schema(memory: Kenning, token: str) -> dict[str, Any]:
    with TestClient(create_app(memory), headers={"Authorization": f"Bearer {token}"}) as client:
        document = client.get("/openapi.json").json()
    body = document["paths"]["/v1/recall"]["post"]["requestBody"]["content"]["application/json"]
    schema = document["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[-1]]
    return string_option(schema["properties"]["session_id"])


def test_mcp_tools_take_the_session_ids_the_http_api_takes(memory: Kenning, token: str) -> None:
    # Given the HTTP API's rule for a session id
    http = http_session_schema(memory, token)
    limit = http["maxLength"]
    longest, one_more = "%" * limit, "%" * (limit + 1)

    async def scenario(url: str) -> tuple[dict[str, dict[str, Any]], list[Any]]:
        async with connected(url, token) as session:
            listed = (await session.list_tools()).tools
            schemas = {
                tool.name: string_option(tool.input_schema["properties"]["session_id"])
                for tool in listed
                if "session_id" in tool.input_schema["properties"]
            }
            answers = [
                await session.call_tool("remember", {"data": "a note", "session_id": longest}),
                await session.call_tool("recall", {"query": "note", "session_id": longest}),
                await session.call_tool("recall", {"query": "note", "session_id": one_more}),
                await session.call_tool("recall", {"query": "note", "session_id": "tab\there"}),
                await session.call_tool("recall", {"query": "note", "session_id": ""}),
            ]
            return schemas, answers

    # When an MCP client lists the tools and uses session ids at and past the limit
    with served(create_app(memory)) as url:
        schemas, answers = anyio.run(scenario, url)
    # Then every tool that takes a session declares the HTTP API's limits
    assert set(schemas) == {"remember", "recall"}
    for schema in schemas.values():
        assert (schema["minLength"], schema["maxLength"], schema["pattern"]) == (
            http["minLength"],
            http["maxLength"],
            http["pattern"],
        )
    # And the longest id is taken; one character more, a control character or none is refused,
    # naming the argument
    remembered, recalled, *refused = answers
    assert not remembered.is_error and not recalled.is_error, [text_of(remembered), text_of(recalled)]
    for answer in refused:
        assert answer.is_error and "session_id" in text_of(answer), text_of(answer)


@pytest.mark.parametrize("session_id", ["%" * 81, "tab\there", "line\n", "caf\u00e9", ""])
def test_python_and_the_command_line_refuse_a_session_id_past_the_rule(
    memory: Kenning, session_id: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Given a session id that HTTP and MCP refuse
    # When Python remembers, recalls or searches with it, Then it is refused, naming session_id
    for attempt in (
        lambda: memory.remember("a note", "notes", session_id),
        lambda: memory.recall("note", ["notes"], session_id),
        lambda: memory.search("note", "CHUNKS", datasets=["notes"], session_id=session_id),
    ):
        with pytest.raises(InputError, match="session_id must be 1 to 80 printable ASCII characters"):
            attempt()
    # And the command line refuses it too (`kenning` prints the error in one line, exit 2)
    monkeypatch.setenv("KENNING_HOME", str(memory.settings.home))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    note = tmp_path / "note.txt"
    note.write_text("a note")
    assert CliRunner().invoke(main, ["add", str(note), "--dataset", "notes"]).exit_code == 0
    done = CliRunner().invoke(main, ["recall", "note", "--dataset", "notes", "--session", session_id])
    assert isinstance(done.exception, InputError) and "session_id" in str(done.exception)
