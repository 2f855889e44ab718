"""The HTTP API does what its OpenAPI document says, no more and no less: every schemathesis check
passes against a served app, types are not coerced, the schema's limits are the stores' limits,
and every error, on every path (MCP's included), has the one shape `{"error": {"code", "message"}}`."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jsonschema  # type: ignore[import-untyped]
import pytest
from fastapi.testclient import TestClient

from bench.api_contract import schemathesis_run, served
from kenning.pipeline.permission import User, issue_key
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.test_mcp import connected, text_of
from tests.integration.test_mcp import served as served_mcp

ADA = "Ada Lovelace wrote the first program for the Analytical Engine."
# A few cases per operation in every phase, from one seed (the same cases each run): the full
# run, 50 cases per operation, is `python -m bench.api_contract [--seed N]`.
EXAMPLES = 3


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Kenning]:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", api_max_upload_bytes=4096)
    with Kenning(settings) as memory:
        memory.add_text(ADA, "notes")
        memory.cognify("notes")
        yield memory


@pytest.fixture
def token(memory: Kenning) -> str:
    user = User(tenant=memory.settings.tenant, name="admin", admin=True)
    memory.wiring.permissions.add_user(user)
    token, key = issue_key(user)
    memory.wiring.permissions.add_key(key)
    return token


@pytest.fixture
def client(memory: Kenning, token: str) -> Iterator[TestClient]:
    with TestClient(create_app(memory), headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


def error_of(response: Any) -> tuple[int, str, str]:
    """Status, code and message of an error answer, which must be `{"error": {code, message}}`."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return response.status_code, body["error"]["code"], body["error"]["message"]


def request_schema(client: TestClient, path: str) -> dict[str, Any]:
    """The JSON request body schema of POST `path`, its references resolved against the document."""
    document = client.get("/openapi.json").json()
    schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return {**schema, "components": document["components"]}


def test_every_schemathesis_check_passes() -> None:
    # Given the app served on 127.0.0.1 over a home with a cognified dataset and a session
    with tempfile.TemporaryDirectory(prefix="kenning-contract-") as tmp, served(Path(tmp) / "home") as app:
        # When schemathesis runs every check in every phase against its OpenAPI document
        code = schemathesis_run(app, EXAMPLES, Path(tmp), "--seed", "1")
    # Then no case fails any check
    assert code == 0, "schemathesis found failures (its report is above)"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/search", {"query": "program", "only_context": "yes"}),
        ("/v1/search", {"query": "program", "top_k": "2"}),
        ("/v1/search", {"query": "program", "top_k": True}),
        ("/v1/recall", {"query": "program", "top_k": "2"}),
        ("/v1/forget", {"dataset": "notes", "memory_only": 0}),
        ("/v1/remember", {"data": [{"text": "hi", "time": 0}], "session_id": "s"}),
        ("/v1/remember", {"data": [{"text": "hi", "time": "1700000000"}], "session_id": "s"}),
        ("/v1/remember", {"data": [{"text": ""}], "session_id": "s"}),
        ("/v1/remember", {"data": [{"text": "hi", "mood": "happy"}], "session_id": "s"}),
    ],
)
def test_values_of_another_type_are_refused_not_converted(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    # When a field is sent as a string, boolean or number it is not (or a message is empty)
    answer = client.post(path, json=body)
    # Then the request is refused, naming the field, and nothing is done
    status, code, message = error_of(answer)
    assert (status, code) == (422, "invalid_request")
    assert any(field in message for field in ("only_context", "top_k", "memory_only", "time", "text", "mood"))
    for internal in ("Value error", "constrained-str", "list[MessageIn]", "function-after"):
        assert internal not in message, message
    assert client.get("/v1/sessions/s").json() == []


def test_numbers_and_times_as_json_writes_them_are_accepted(client: TestClient) -> None:
    # A JSON number with no fraction is an integer, as the schema's `integer` says
    assert (
        client.post("/v1/search", json={"query": "program", "type": "CHUNKS", "top_k": 2.0}).status_code
        == 200
    )
    # And a message's time is an ISO 8601 string, kept as it was said
    message = {"speaker": "ada", "text": "I wrote it in 1843", "time": "1843-09-01T10:00:00Z"}
    remembered = client.post("/v1/remember", json={"data": [message], "session_id": "s"})
    assert remembered.status_code == 200, remembered.text
    [entry] = client.get("/v1/sessions/s").json()
    assert "1843-09-01T10:00:00" in json.dumps(entry) and "1970" not in json.dumps(entry)


def test_every_session_id_the_schema_allows_is_accepted(client: TestClient) -> None:
    # Given the longest session id the schema allows, of characters each stored as three ("%XX")
    document = client.get("/openapi.json").json()
    remember = document["paths"]["/v1/remember"]["post"]["requestBody"]["content"]["application/json"]
    schema = document["components"]["schemas"][remember["schema"]["$ref"].rsplit("/", 1)[-1]]
    session = next(option for option in schema["properties"]["session_id"]["anyOf"] if "maxLength" in option)
    longest = "%" * session["maxLength"]
    # When it is used on every route that takes a session
    answers = [
        client.post("/v1/remember", json={"data": "a note", "session_id": longest}),
        client.post("/v1/recall", json={"query": "note", "session_id": longest}),
        client.post("/v1/search", json={"query": "note", "type": "CHUNKS", "session_id": longest}),
        client.get(f"/v1/sessions/{longest}"),
    ]
    # Then each is answered
    assert [answer.status_code for answer in answers] == [200, 200, 200, 200], [a.text for a in answers]
    # And one character more is refused by the schema, with the rule, never by a store
    status, code, message = error_of(client.get(f"/v1/sessions/{longest}%25"))
    assert (status, code) == (422, "invalid_request") and "session_id" in message


@pytest.mark.parametrize(
    ("as_of", "status"),
    [
        ("2024", 200),
        ("2024-05", 200),
        ("2024-05-01", 200),
        ("2024-05-01T14:30:00Z", 200),
        # the first instant, a minute east of UTC: a moment before any in UTC, not a server error
        ("0001-01-01T00:00:00+00:01", 200),
        ("", 422),
        ("000000", 422),
        ("2024-02-30", 422),
        ("2024-01-01T12:99:00Z", 422),
    ],
)
def test_a_moment_to_answer_as_of_is_what_the_schema_says(
    client: TestClient, as_of: str, status: int
) -> None:
    search = client.post("/v1/search", json={"query": "program", "type": "CHUNKS", "as_of": as_of})
    recall = client.post("/v1/recall", json={"query": "program", "as_of": as_of})
    history = client.get("/v1/datasets/notes/history", params={"entity": "Ada Lovelace", "as_of": as_of})
    assert [search.status_code, recall.status_code] == [status, status], search.text
    assert history.status_code in ((200, 404) if status == 200 else (422,)), history.text


def test_an_add_of_nothing_is_invalid_by_the_schema_and_refused(client: TestClient) -> None:
    schema = request_schema(client, "/v1/add")
    nothing: list[dict[str, Any]] = [{}, {"texts": []}, {"dataset": "notes", "texts": [], "uris": []}]
    for body in nothing:
        assert not jsonschema.Draft202012Validator(schema).is_valid(body)
        assert error_of(client.post("/v1/add", json=body))[:2] == (422, "invalid_request")
    assert jsonschema.Draft202012Validator(schema).is_valid({"texts": [ADA]})


def test_errors_have_one_shape_and_tell_what_is_allowed(client: TestClient) -> None:
    # 404 and 422 as before
    assert error_of(client.get("/v1/nowhere"))[:2] == (404, "not_found")
    # 405 lists every method of the path, whichever route the router tried first
    for path, allowed in (
        ("/v1/records", "GET, POST"),
        ("/v1/records/some-id", "DELETE, GET, PUT"),
        ("/v1/datasets/notes/permissions", "GET, POST"),
    ):
        answer = client.patch(path)
        assert error_of(answer)[:2] == (405, "method_not_allowed")
        assert answer.headers["allow"] == allowed
    # 415 for a body that is not JSON on every route that reads JSON, not a schema error
    for path in ("/v1/search", "/v1/recall", "/v1/remember", "/v1/add", "/v1/forget"):
        answer = client.post(path, content=b"query=program", headers={"Content-Type": "text/plain"})
        assert error_of(answer)[:2] == (415, "unsupported_media_type"), path
    # A run that has ended cannot be cancelled: a conflict with the run as it is
    run = client.get("/v1/runs").json()["runs"][0]
    assert error_of(client.post(f"/v1/runs/{run['id']}/cancel"))[:2] == (409, "conflict")
    # A search type this server does not run for the caller is refused, not called invalid input
    cypher = client.post("/v1/search", json={"query": "MATCH (n) RETURN n", "type": "CYPHER"})
    assert error_of(cypher)[:2] == (403, "query_rejected")


def test_a_form_field_error_names_its_field(client: TestClient) -> None:
    files = [("files", ("a.txt", b"hello", "text/plain"))]
    bad_dataset = client.post("/v1/add", files=files, data={"dataset": "a/b"})
    assert error_of(bad_dataset)[2].startswith("dataset:")
    bad_node_set = client.post("/v1/add", files=files, data={"node_sets": ["ok", "bad\x01"]})
    assert error_of(bad_node_set)[2].startswith("node_sets.1:")
    two_datasets = client.post("/v1/add", files=files, data={"dataset": ["one", "two"]})
    assert error_of(two_datasets)[2].startswith("dataset:")


def test_the_run_events_are_described_one_by_one(client: TestClient) -> None:
    # Given the document's schema of one event of the stream
    document = client.get("/openapi.json").json()
    answer = document["paths"]["/v1/runs/{run_id}/events"]["get"]["responses"]["200"]
    event_schema = answer["content"]["text/event-stream"]["schema"]
    kinds = {option["properties"]["event"]["const"]: option for option in event_schema["oneOf"]}
    assert set(kinds) == {"progress", "end", "error"}
    # When a run's events are read
    run = client.get("/v1/runs").json()["runs"][0]
    with client.stream("GET", f"/v1/runs/{run['id']}/events") as stream:
        events = parse_events("".join(stream.iter_text()))
    # Then each is one of them, and its data is JSON of the schema that event names
    assert [name for name, _ in events] == ["progress", "end"]
    for name, data in events:
        payload = kinds[name]["properties"]["data"]
        assert payload["contentMediaType"] == "application/json"
        schema = {**payload["contentSchema"], "components": document["components"]}
        jsonschema.Draft202012Validator(schema).validate(json.loads(data))


def parse_events(text: str) -> list[tuple[str, str]]:
    events = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            events.append((fields["event"], fields["data"]))
    return events


def test_mcp_refusals_have_the_api_error_shape(memory: Kenning, token: str) -> None:
    with served_mcp(create_app(memory)) as url:
        # No key: 401, in the API's shape
        no_key = httpx2.post(url, json={})
        assert error_of(no_key)[:2] == (401, "unauthorized")
        # A body over the limit, its size not declared up front: 413, in the API's shape
        chunks = iter([b'{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"p": "', b"y" * 5000, b'"}}'])
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
        too_large = httpx2.post(url, content=chunks, headers={**headers, "Content-Type": "application/json"})
        assert error_of(too_large)[:2] == (413, "too_large")


def test_mcp_argument_errors_name_the_argument_in_plain_words(memory: Kenning, token: str) -> None:
    async def scenario(url: str) -> str:
        async with connected(url, token) as session:
            result = await session.call_tool("search", {"query": "program", "top_k": "many"})
            assert result.is_error
            return text_of(result)

    with served_mcp(create_app(memory)) as url:
        message = anyio.run(scenario, url)
    assert "top_k" in message
    for internal in ("pydantic", "input_value", "input_type", "type=", "validation error for"):
        assert internal not in message, message
