"""The HTTP API end to end: keys from the command line, then add, cognify, recall, forget, runs,
sessions, records and sharing over HTTP, with JSON errors and the permission rules."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from kenning.pipeline.locking import held, lock_name
from kenning.pipeline.models import Scope, utcnow
from kenning.pipeline.permission import Permission, User, issue_key
from kenning.workers.api import create_app
from kenning.workers.api.app import listening_socket
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.services import free_port

ADA = b"Ada Lovelace wrote the first published algorithm for the Analytical Engine."
BABBAGE = b"Charles Babbage designed the Analytical Engine in London."


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One home for the app and the command line."""
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    return tmp_path / "home"


@pytest.fixture
def memory(home: Path) -> Iterator[Kenning]:
    with Kenning(load_settings(home=home, embedding_provider="hash", api_max_upload_bytes=4096)) as memory:
        yield memory


@pytest.fixture
def client(memory: Kenning) -> Iterator[TestClient]:
    with TestClient(create_app(memory)) as client:
        yield client


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Response(Protocol):
    """What the tests read of a test client's response."""

    @property
    def status_code(self) -> int: ...
    def json(self) -> Any: ...


def status(response: Response) -> int:
    return response.status_code


def error_of(response: Response) -> tuple[int, str]:
    """The status and error code of an error answer, which must be `{"error": {code, message}}`."""
    body = response.json()
    assert set(body) == {"error"} and body["error"]["message"]
    return response.status_code, str(body["error"]["code"])


def key_for(memory: Kenning, name: str, grants: dict[str, list[Permission]], admin: bool = False) -> str:
    store = memory.wiring.permissions
    user = User(tenant=memory.settings.tenant, name=name, admin=admin)
    store.add_user(user)
    for dataset, permissions in grants.items():
        store.grant(user, dataset, permissions)
    token, key = issue_key(user)
    store.add_key(key)
    return token


def test_agent_round_trip_over_http(client: TestClient) -> None:
    # Given a user with a key from the command line, who may read, write and delete `notes`
    cli("user", "create", "ada")
    token = cli("key", "create", "--user", "ada").strip().splitlines()[-1]
    cli("dataset", "share", "notes", "--user", "ada", "--permission", "read", "--permission", "write")
    cli("user", "grant", "ada", "notes", "--permission", "delete")
    auth = bearer(token)

    # When it uploads two files and cognifies, waiting for the run
    files = [("files", ("ada.txt", ADA, "text/plain")), ("files", ("babbage.txt", BABBAGE, "text/plain"))]
    added = client.post("/v1/add", headers=auth, files=files, data={"dataset": "notes"})
    assert added.status_code == 200, added.text
    ada_id = next(item["id"] for item in added.json()["added"] if item["name"] == "ada.txt")
    run = client.post("/v1/cognify?wait=true", headers=auth, json={"dataset": "notes"})
    assert run.status_code == 200 and run.json()["status"] == "completed", run.text

    # Then recall finds the text, citing the item, document and chunk it came from
    recalled = client.post(
        "/v1/recall", headers=auth, json={"query": "Lovelace algorithm", "datasets": ["notes"]}
    )
    hits = recalled.json()["results"]
    assert any("Lovelace" in hit["text"] for hit in hits)
    ada_hit = next(hit for hit in hits if "Lovelace" in hit["text"])
    assert ada_hit["data_id"] == ada_id and ada_hit["document_id"] and ada_hit["chunk_id"]

    # When that item is forgotten
    forgotten = client.post("/v1/forget", headers=auth, json={"dataset": "notes", "data_ids": [ada_id]})
    assert forgotten.status_code == 200 and forgotten.json()["items"] == [ada_id]

    # Then recall returns nothing of it, and the other item stays
    again = client.post(
        "/v1/recall", headers=auth, json={"query": "Lovelace algorithm", "datasets": ["notes"]}
    )
    assert all("Lovelace" not in hit["text"] and hit["data_id"] != ada_id for hit in again.json()["results"])
    babbage = client.post("/v1/search", headers=auth, json={"query": "Babbage", "type": "CHUNKS"})
    assert any("Babbage" in hit["text"] for hit in babbage.json()["results"])
    records = client.get("/v1/records", headers=auth, params={"dataset": "notes"}).json()
    assert records["total"] == 1 and records["records"][0]["name"] == "babbage.txt"

    # And a revoked key stops working at once
    cli("key", "revoke", token)
    denied = client.get("/v1/me", headers=auth)
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"


def test_cognify_answers_at_once_and_streams_progress(memory: Kenning, client: TestClient) -> None:
    auth = bearer(key_for(memory, "ada", {"notes": [Permission.READ, Permission.WRITE]}))
    client.post("/v1/add", headers=auth, json={"dataset": "notes", "texts": [ADA.decode()]})

    # When a run is started without waiting
    started = client.post("/v1/cognify", headers=auth, json={"dataset": "notes"})

    # Then it is accepted with its id, and its events end when it does, with the step counters
    assert started.status_code == 202
    run_id = started.json()["id"]
    events: list[tuple[str, dict[str, object]]] = []
    with client.stream("GET", f"/v1/runs/{run_id}/events", headers=auth) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        kind = ""
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
    assert events[-1][0] == "end" and events[-1][1]["status"] == "completed"
    assert events[-1][1]["stats"]["chunks_to_extract"] == 1  # type: ignore[index]
    run = client.get(f"/v1/runs/{run_id}", headers=auth).json()
    assert run["status"] == "completed" and run["dataset"] == "notes" and run["progress"]["load"] == [1, 1]


def test_errors_are_json_with_stable_codes(memory: Kenning, client: TestClient) -> None:
    auth = bearer(key_for(memory, "ada", {"notes": list(Permission)}))

    no_key = client.get("/v1/me")
    assert error_of(no_key) == (401, "unauthorized") and no_key.headers["www-authenticate"] == "Bearer"
    assert error_of(client.get("/v1/me", headers=bearer("kn_0123_nope"))) == (401, "unauthorized")
    assert error_of(client.get("/v1/nowhere", headers=auth)) == (404, "not_found")
    assert error_of(client.put("/v1/me", headers=auth)) == (405, "method_not_allowed")
    assert error_of(client.post("/v1/search", headers=auth, json={"query": ""})) == (422, "invalid_request")
    assert error_of(client.post("/v1/search", headers=auth, content=b"{")) == (422, "invalid_request")
    assert error_of(client.post("/v1/add", headers=auth, json={"texts": []})) == (422, "invalid_request")
    assert error_of(client.post("/v1/add", headers=auth, json={"uris": ["/etc/passwd"]})) == (
        422,
        "invalid_request",
    )
    assert error_of(client.post("/v1/add", headers=auth, content=b"x", params={})) == (422, "invalid_request")
    plain = client.post("/v1/add", headers={**auth, "Content-Type": "text/plain"}, content=b"hello")
    assert error_of(plain) == (415, "unsupported_media_type")
    assert error_of(client.get("/v1/records/nothing", headers=auth)) == (404, "not_found")
    assert error_of(
        client.post("/v1/sessions/s1/feedback", headers=auth, json={"entry_id": "e", "score": 3})
    ) == (
        404,
        "not_found",
    )

    # Uploads over the limit are refused, whether the size is declared or not
    big = [("files", ("big.txt", b"x" * 5000, "text/plain"))]
    assert error_of(client.post("/v1/add", headers=auth, files=big, data={"dataset": "notes"})) == (
        413,
        "too_large",
    )
    chunks = iter([b'{"texts": ["', b"y" * 5000, b'"]}'])
    streamed = client.post("/v1/add", headers={**auth, "Content-Type": "application/json"}, content=chunks)
    assert error_of(streamed) == (413, "too_large")
    assert memory.wiring.metadata.list_datasets(memory.settings.tenant) == []

    # Liveness and readiness need no key
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json()["status"] == "ready"
    assert client.get("/openapi.json").json()["paths"]["/v1/search"]["post"]


def test_permissions_decide_what_a_caller_sees_and_changes(memory: Kenning, client: TestClient) -> None:
    read, write = Permission.READ, Permission.WRITE
    # Given an owner of two datasets, a reader of one, and a writer who may not read
    owner = bearer(key_for(memory, "owner", {"notes": list(Permission), "secret": list(Permission)}))
    reader = bearer(key_for(memory, "reader", {"notes": [read]}))
    dropper = bearer(key_for(memory, "dropper", {"inbox": [write]}))
    for dataset, text in (("notes", ADA), ("secret", BABBAGE)):
        added = client.post("/v1/add", headers=owner, json={"dataset": dataset, "texts": [text.decode()]})
        assert added.status_code == 200
        assert (
            client.post("/v1/cognify?wait=true", headers=owner, json={"dataset": dataset}).status_code == 200
        )
    secret_id = memory.records.list("secret").records[0].id
    notes_id = memory.records.list("notes").records[0].id

    # Then the reader's searches see `notes` and nothing of `secret`, with no error either way
    for body in (
        {"query": "Analytical Engine", "type": "CHUNKS"},
        {"query": "Analytical Engine", "type": "CHUNKS", "datasets": ["secret", "notes", "absent"]},
    ):
        hits = client.post("/v1/search", headers=reader, json=body).json()["results"]
        assert hits and {hit["dataset"] for hit in hits} == {"notes"}
    only_secret = client.post("/v1/search", headers=reader, json={"query": "Babbage", "datasets": ["secret"]})
    assert only_secret.status_code == 200 and only_secret.json()["results"] == []

    # And what it may not read is not found, whether it exists or not; what it reads but may not
    # change is forbidden
    assert status(client.get(f"/v1/records/{secret_id}", headers=reader)) == 404
    assert status(client.get(f"/v1/records/{notes_id}", headers=reader)) == 200
    assert status(client.get("/v1/records", headers=reader, params={"dataset": "secret"})) == 404
    assert status(client.get("/v1/records", headers=reader, params={"dataset": "nothing-here"})) == 404
    assert status(client.post("/v1/forget", headers=reader, json={"dataset": "secret"})) == 404
    assert status(client.post("/v1/forget", headers=reader, json={"dataset": "notes"})) == 403
    assert status(client.delete(f"/v1/records/{notes_id}", headers=reader)) == 403
    assert status(client.put(f"/v1/records/{notes_id}", headers=reader, json={"text": "x"})) == 403
    assert status(client.post("/v1/add", headers=reader, json={"dataset": "notes", "texts": ["x"]})) == 403
    assert status(client.post("/v1/add", headers=reader, json={"dataset": "secret", "texts": ["x"]})) == 404
    assert status(client.post("/v1/cognify", headers=reader, json={"dataset": "secret"})) == 404
    assert status(client.get("/v1/datasets/notes/permissions", headers=reader)) == 403
    assert [d["name"] for d in client.get("/v1/datasets", headers=reader).json()["datasets"]] == ["notes"]
    assert memory.records.list("notes").total == 1 and memory.records.list("secret").total == 1

    # And a writer that may not read adds to its dataset but reads nothing back
    dropped = client.post("/v1/add", headers=dropper, json={"dataset": "inbox", "texts": ["a note"]})
    assert dropped.status_code == 200
    assert status(client.get("/v1/records", headers=dropper, params={"dataset": "inbox"})) == 404
    assert client.post("/v1/search", headers=dropper, json={"query": "note"}).json()["results"] == []

    # When the owner shares `secret` with the reader over HTTP, the reader sees it at its next request
    shared = client.post(
        "/v1/datasets/secret/permissions", headers=owner, json={"user": "reader", "permissions": [read]}
    )
    assert shared.json()["grants"]["reader"] == ["read"]
    hits = client.post("/v1/search", headers=reader, json={"query": "Babbage", "datasets": ["secret"]})
    assert {hit["dataset"] for hit in hits.json()["results"]} == {"secret"}
    assert (
        status(
            client.post(
                "/v1/datasets/secret/permissions",
                headers=owner,
                json={"user": "nobody", "permissions": [read]},
            )
        )
        == 404
    )

    # And when it revokes it, the reader loses it at once
    revoked = client.delete("/v1/datasets/secret/permissions/reader", headers=owner)
    assert "reader" not in revoked.json()["grants"]
    assert status(client.get(f"/v1/records/{secret_id}", headers=reader)) == 404
    assert client.get("/v1/me", headers=reader).json()["grants"] == {"notes": ["read"]}


def test_sessions_records_and_feedback(memory: Kenning, client: TestClient) -> None:
    auth = bearer(key_for(memory, "ada", {"chat": list(Permission)}))
    other = bearer(key_for(memory, "bob", {"chat": list(Permission)}))

    # Given messages remembered into a session (the graph follows in the background)
    remembered = client.post(
        "/v1/remember",
        headers=auth,
        json={
            "data": [{"speaker": "Caroline", "text": "I joined the support group."}],
            "dataset": "chat",
            "session_id": "s1",
        },
    )
    assert remembered.status_code == 200 and remembered.json()["status"] == "queued"

    # When the session is recalled from, then the answer entry rated
    recalled = client.post(
        "/v1/recall", headers=auth, json={"query": "support group", "datasets": ["chat"], "session_id": "s1"}
    ).json()
    assert recalled["results"][0]["source"] == "session"
    rated = client.post(
        "/v1/sessions/s1/feedback", headers=auth, json={"entry_id": recalled["entry_id"], "score": 5}
    )
    assert rated.json() == {"ok": True}

    # Then the session shows its entries to its user alone
    entries = client.get("/v1/sessions/s1", headers=auth).json()
    assert [entry["kind"] for entry in entries] == ["message", "qa"] and entries[1]["feedback_score"] == 5
    assert client.get("/v1/sessions/s1", headers=other).json() == []
    assert client.delete(f"/v1/sessions/s1/feedback/{recalled['entry_id']}", headers=auth).status_code == 200

    # And records are created, read, updated and deleted over HTTP
    created = client.post(
        "/v1/records", headers=auth, json={"text": "Nora Blake is the CEO.", "dataset": "chat"}
    )
    assert created.status_code == 201
    record_id = created.json()["id"]
    assert client.get(f"/v1/records/{record_id}", headers=auth).json()["node_ids"]
    updated = client.put(f"/v1/records/{record_id}", headers=auth, json={"text": "Oliver Reed is the CEO."})
    # The record keeps its id: the URL updated answers with the new text
    assert updated.status_code == 200 and updated.json()["id"] == record_id
    assert client.get(f"/v1/records/{record_id}", headers=auth).json()["text"] == "Oliver Reed is the CEO."
    assert client.delete(f"/v1/records/{record_id}", headers=auth).json() == {"ok": True}
    assert client.get(f"/v1/records/{record_id}", headers=auth).status_code == 404


def start_serve(*options: str) -> tuple[subprocess.Popen[bytes], str]:
    """`kenning serve` on a free port of 127.0.0.1, answering, in a process group of its own
    (see `stop_serve`); the process and its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "kenning.workers.cli", "serve", "--port", str(port), *options]
    quiet = subprocess.DEVNULL
    server = subprocess.Popen(command, stdout=quiet, stderr=quiet, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            assert httpx.get(f"{base}/health", timeout=2).json() == {"status": "ok"}
            return server, base
        except httpx.TransportError:
            if time.monotonic() > deadline or server.poll() is not None:
                stop_serve(server)
                raise AssertionError("kenning serve did not start") from None
            time.sleep(0.2)


def stop_serve(server: subprocess.Popen[bytes]) -> None:
    """Terminate the server and, whatever happens to it, every process of its group."""
    server.terminate()
    try:
        server.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


def worker_pids(pid: int) -> list[int]:
    """The worker processes `kenning serve --workers` started (multiprocessing's spawned children,
    not its resource tracker)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
            if int(fields[1]) == pid and b"spawn_main" in command:
                found.append(int(stat.parent.name))
    return found


def test_kenning_serve_answers_on_a_port(home: Path) -> None:
    # Given an admin's key, and `kenning serve` started on a free port
    cli("user", "create", "ada", "--admin")
    token = cli("key", "create", "--user", "ada").strip().splitlines()[-1]
    server, base = start_serve()
    try:
        # Then it answers over HTTP, as the key's user
        me = httpx.get(f"{base}/v1/me", headers=bearer(token), timeout=10).json()
        assert (me["user"], me["admin"]) == ("ada", True)
    finally:
        stop_serve(server)


def test_kenning_serve_with_workers_runs_several_processes_on_one_home(home: Path) -> None:
    # Given a dataset cognified on the home, and `kenning serve --workers 2` on it
    cli("user", "create", "ada", "--admin")
    token = cli("key", "create", "--user", "ada").strip().splitlines()[-1]
    with Kenning(load_settings()) as memory:
        memory.add_text(ADA.decode(), dataset="notes")
        memory.cognify(dataset="notes")
    server, base = start_serve("--workers", "2")
    try:
        # Then two worker processes run, and every search finds Ada, whichever answers
        workers = worker_pids(server.pid)
        assert len(workers) == 2
        body = {"query": "Who wrote the first algorithm?", "datasets": ["notes"], "type": "CHUNKS"}
        for _ in range(6):
            found = httpx.post(f"{base}/v1/search", headers=bearer(token), json=body, timeout=30)
            assert found.status_code == 200 and "Ada" in json.dumps(found.json())
        assert httpx.get(f"{base}/ready", timeout=30).json()["status"] == "ready"
        server.terminate()
        assert server.wait(timeout=60) == 0
    finally:
        stop_serve(server)
    # and stopping the server stopped them
    assert [pid for pid in workers if Path(f"/proc/{pid}").exists()] == []


def test_kenning_serve_with_workers_refuses_bad_settings_and_a_port_in_use(home: Path) -> None:
    command = [sys.executable, "-m", "kenning.workers.cli", "serve", "--workers", "2", "--port"]
    env = {**os.environ, "KENNING_EMBEDDING_PROVIDER": "no-such-provider"}
    refused = subprocess.run([*command, str(free_port())], env=env, capture_output=True, timeout=120)
    assert refused.returncode == 2 and b"error:" in refused.stdout + refused.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = subprocess.run([*command, str(taken.getsockname()[1])], capture_output=True, timeout=120)
    assert busy.returncode == 2 and b"cannot listen on" in busy.stdout + busy.stderr


def test_an_event_stream_ends_when_its_key_is_revoked(memory: Kenning, client: TestClient) -> None:
    token = key_for(memory, "ada", {"notes": [Permission.READ, Permission.WRITE]})
    client.post("/v1/add", headers=bearer(token), json={"dataset": "notes", "texts": [ADA.decode()]})
    scope = Scope(tenant=memory.settings.tenant, dataset="notes")
    # Given a run that waits for its dataset, which another holds
    with held(memory.wiring.lock, lock_name(scope), 60):
        run_id = client.post("/v1/cognify", headers=bearer(token), json={"dataset": "notes"}).json()["id"]
        events = []
        with client.stream("GET", f"/v1/runs/{run_id}/events", headers=bearer(token)) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
                    # When the key is revoked while its stream is open
                    memory.wiring.permissions.revoke_key(token.split("_")[1], utcnow())
    # Then the stream ends with an error saying so, the run going on without it
    assert events[0]["status"] == "initiated"
    assert events[-1] == {"error": {"code": "unauthorized", "message": "the API key is unknown or revoked"}}


def test_the_socket_workers_share_accepts_connections_without_nagle_delays() -> None:
    # Given the socket `kenning serve --workers` binds, served by asyncio as uvicorn serves it
    listener = listening_socket("127.0.0.1", 0)
    no_delay: list[int] = []

    class Probe(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted = transport.get_extra_info("socket")
            no_delay.append(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def connect_once() -> None:
        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname())
        for _ in range(500):
            if no_delay:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()

    # When a client connects
    asyncio.run(connect_once())

    # Then its connection sends answers at once (TCP_NODELAY), not after the client's delayed ACK
    assert no_delay and no_delay[0] != 0
