"""One contract for every VectorStore: the in-memory twin, Qdrant Edge, Qdrant local mode and server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from kenning.pipeline.errors import DimensionMismatch, StoreError, TransientStoreError
from kenning.pipeline.models import Scope, VectorPoint, stable_id
from kenning.pipeline.ports import VectorStore
from kenning.storage.vectors.edge import EdgeVectorStore
from kenning.storage.vectors.memory import MemoryVectorStore
from kenning.storage.vectors.qdrant import QdrantVectorStore
from tests.services import free_port

QDRANT_URL = os.environ.get("KENNING_QDRANT_URL", "")
SCOPE = Scope(tenant="acme", dataset="papers")
OTHER = Scope(tenant="acme", dataset="letters")


def make_store(kind: str, tmp_path: Path, batch_size: int = 128) -> VectorStore:
    if kind == "memory":
        return MemoryVectorStore()
    if kind == "edge":
        return EdgeVectorStore(tmp_path / "vectors", batch_size=batch_size)
    if kind == "qdrant-local":
        return QdrantVectorStore(path=tmp_path / "qdrant", batch_size=batch_size)
    if not QDRANT_URL:
        pytest.skip("KENNING_QDRANT_URL is not set: no Qdrant server to test against")
    return QdrantVectorStore(url=QDRANT_URL, batch_size=batch_size)


@pytest.fixture(params=["memory", "edge", "qdrant-local", "qdrant-server"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def prefix() -> str:
    """A collection-name prefix of this test's own, so runs against one server never meet."""
    return f"t{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def store(kind: str, tmp_path: Path, prefix: str) -> Iterator[VectorStore]:
    made = make_store(kind, tmp_path, batch_size=100)
    yield made
    made.close()
    if kind == "qdrant-server":
        drop_collections(prefix)


def drop_collections(prefix: str) -> None:
    from qdrant_client import QdrantClient

    client = QdrantClient(url=QDRANT_URL)
    try:
        for collection in client.get_collections().collections:
            if collection.name.startswith(prefix):
                client.delete_collection(collection.name)
    finally:
        client.close()


def point(key: str, vector: list[float], **payload: object) -> VectorPoint:
    return VectorPoint(id=stable_id("test", key), vector=vector, payload=dict(payload))


def test_search_returns_the_closest_points_first(store: VectorStore, prefix: str) -> None:
    # Given three points at growing angles from the x axis
    name = prefix + "DocumentChunk_text"
    store.ensure_collection(name, 3)
    store.upsert(
        SCOPE,
        name,
        [point("far", [0.0, 1.0, 0.0]), point("near", [1.0, 0.0, 0.0]), point("mid", [1.0, 1.0, 0.0])],
    )

    # When searching along the x axis
    hits = store.search(SCOPE, name, [2.0, 0.0, 0.0], limit=10)

    # Then the nearest comes first and distances grow
    assert [h.id for h in hits] == [stable_id("test", k) for k in ("near", "mid", "far")]
    assert [h.score for h in hits] == sorted(h.score for h in hits)


def test_score_is_cosine_distance(store: VectorStore, prefix: str) -> None:
    name = prefix + "Entity_name"
    store.ensure_collection(name, 2)
    store.upsert(
        SCOPE, name, [point("same", [3.0, 4.0]), point("orth", [-4.0, 3.0]), point("opp", [-3.0, -4.0])]
    )

    scores = {h.id: h.score for h in store.search(SCOPE, name, [0.6, 0.8], limit=3)}

    assert scores[stable_id("test", "same")] == pytest.approx(0.0, abs=1e-5)
    assert scores[stable_id("test", "orth")] == pytest.approx(1.0, abs=1e-5)
    assert scores[stable_id("test", "opp")] == pytest.approx(2.0, abs=1e-5)
    assert all(0.0 <= s <= 2.0 for s in scores.values())


def test_limit_caps_the_hits(store: VectorStore, prefix: str) -> None:
    name = prefix + "Entity_name"
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point(str(i), [1.0, float(i)]) for i in range(5)])

    assert len(store.search(SCOPE, name, [1.0, 0.0], limit=2)) == 2
    assert store.search(SCOPE, name, [1.0, 0.0], limit=0) == []


def test_reupsert_replaces_without_duplicating(store: VectorStore, prefix: str) -> None:
    # Given two points already stored
    name = prefix + "Entity_name"
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point("a", [1.0, 0.0], name="old"), point("b", [0.0, 1.0])])

    # When the same ids are written again with new content
    store.upsert(SCOPE, name, [point("a", [0.0, 1.0], name="new"), point("b", [0.0, 1.0])])

    # Then the count is unchanged and the latest vector and payload win
    assert store.count(SCOPE, name) == 2
    hit = store.search(SCOPE, name, [0.0, 1.0], limit=2)
    by_id = {h.id: h for h in hit}
    assert by_id[stable_id("test", "a")].payload["name"] == "new"
    assert by_id[stable_id("test", "a")].score == pytest.approx(0.0, abs=1e-5)


def test_scopes_never_see_each_other(store: VectorStore, prefix: str) -> None:
    # Given two datasets sharing one collection, and another tenant with a dataset of the same name
    name = prefix + "DocumentChunk_text"
    foreign = Scope(tenant="globex", dataset=SCOPE.dataset)
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point("p1", [1.0, 0.0]), point("p2", [0.9, 0.1])])
    store.upsert(OTHER, name, [point("o1", [1.0, 0.0])])
    store.upsert(foreign, name, [point("f1", [1.0, 0.0])])

    # When each scope searches for the same vector
    mine = store.search(SCOPE, name, [1.0, 0.0], limit=10)
    theirs = store.search(OTHER, name, [1.0, 0.0], limit=10)

    # Then each sees only its own points, stamped with its scope
    assert {h.id for h in mine} == {stable_id("test", "p1"), stable_id("test", "p2")}
    assert [h.id for h in theirs] == [stable_id("test", "o1")]
    assert all(h.payload["tenant"] == "acme" and h.payload["dataset"] == "papers" for h in mine)
    assert (store.count(SCOPE, name), store.count(OTHER, name), store.count(foreign, name)) == (2, 1, 1)
    assert store.search(Scope(tenant="acme", dataset="empty"), name, [1.0, 0.0], limit=10) == []


def test_a_small_scope_is_found_behind_a_crowd_of_closer_points(store: VectorStore, prefix: str) -> None:
    # Given another dataset with 300 points right at the query, and ours with three far from it
    name = prefix + "DocumentChunk_text"
    store.ensure_collection(name, 2)
    store.upsert(OTHER, name, [point(f"crowd{i}", [1.0, i / 1000]) for i in range(300)])
    store.upsert(SCOPE, name, [point(f"ours{i}", [-i / 10, 1.0]) for i in range(3)])

    # When our dataset searches near the crowd
    hits = store.search(SCOPE, name, [1.0, 0.0], limit=2)

    # Then it gets its own closest points, never the crowd
    assert [h.id for h in hits] == [stable_id("test", "ours0"), stable_id("test", "ours1")]


def test_the_scope_overrides_payload_fields_of_the_same_name(store: VectorStore, prefix: str) -> None:
    name = prefix + "Entity_name"
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point("x", [1.0, 0.0], tenant="globex", dataset="secrets")])

    assert store.count(Scope(tenant="globex", dataset="secrets"), name) == 0
    assert store.search(SCOPE, name, [1.0, 0.0], limit=1)[0].payload["tenant"] == "acme"


def test_another_dimension_is_refused(store: VectorStore, prefix: str) -> None:
    # Given a collection made for 384-dimensional vectors
    name = prefix + "Entity_name"
    store.ensure_collection(name, 384)
    store.ensure_collection(name, 384)

    # When it is asked for with another size, or fed another size, it refuses loudly
    with pytest.raises(DimensionMismatch, match=r"384.*768|768.*384"):
        store.ensure_collection(name, 768)
    with pytest.raises(DimensionMismatch):
        store.upsert(SCOPE, name, [point("short", [1.0, 0.0])])
    with pytest.raises(DimensionMismatch):
        store.search(SCOPE, name, [1.0, 0.0], limit=1)
    assert store.count(SCOPE, name) == 0


def test_unknown_collection_gives_no_hits(store: VectorStore, prefix: str) -> None:
    assert store.search(SCOPE, prefix + "Nothing_here", [1.0, 0.0], limit=5) == []
    assert store.count(SCOPE, prefix + "Nothing_here") == 0


def test_upsert_into_unknown_collection_is_an_error(store: VectorStore, prefix: str) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        store.upsert(SCOPE, prefix + "Nothing_here", [point("a", [1.0, 0.0])])


def test_point_ids_must_be_uuids(store: VectorStore, prefix: str) -> None:
    name = prefix + "Entity_name"
    store.ensure_collection(name, 2)

    with pytest.raises(StoreError):
        store.upsert(SCOPE, name, [VectorPoint(id="not-a-uuid", vector=[1.0, 0.0])])


def test_list_collections_names_each_created_collection(store: VectorStore, prefix: str) -> None:
    names = [prefix + "DocumentChunk_text", prefix + "Entity_name", prefix + "TextSummary_text"]
    for name in names:
        store.ensure_collection(name, 4)

    listed = [n for n in store.list_collections() if n.startswith(prefix)]

    assert listed == sorted(names)


def test_payload_round_trips(store: VectorStore, prefix: str) -> None:
    name = prefix + "DocumentChunk_text"
    payload = {
        "text": "Zoë met 李雷 in Zürich 🚀",
        "index": 7,
        "ratio": 0.25,
        "flag": True,
        "data_ids": ["d1", "d2"],
        "nested": {"k": [1, 2, {"z": None}]},
    }
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point("u", [0.5, 0.5], **payload)])

    [hit] = store.search(SCOPE, name, [0.5, 0.5], limit=1)

    assert hit.payload == {**payload, "tenant": SCOPE.tenant, "dataset": SCOPE.dataset}


def test_search_can_return_only_some_payload_fields(store: VectorStore, prefix: str) -> None:
    name = prefix + "Edge_description"
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point("e", [1.0, 0.0], text="a long sentence", source_id="s", target_id="t")])

    [hit] = store.search(SCOPE, name, [1.0, 0.0], limit=1, fields=("source_id", "target_id"))

    scope_fields = {"tenant": SCOPE.tenant, "dataset": SCOPE.dataset}
    assert hit.payload == {"source_id": "s", "target_id": "t", **scope_fields}


def test_a_thousand_points_in_batches(store: VectorStore, prefix: str) -> None:
    # Given 1,000 random points, more than the store's batch of 100
    name = prefix + "DocumentChunk_text"
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(1000, 16))
    store.ensure_collection(name, 16)
    store.upsert(SCOPE, name, [point(str(i), [float(x) for x in v], n=i) for i, v in enumerate(vectors)])

    # When searching for one of them
    hits = store.search(SCOPE, name, [float(x) for x in vectors[613]], limit=3)

    # Then all were stored, and the point itself comes first
    assert store.count(SCOPE, name) == 1000
    assert hits[0].id == stable_id("test", "613")
    assert hits[0].payload["n"] == 613
    assert hits[0].score == pytest.approx(0.0, abs=1e-5)


# Qdrant local mode only: the client opens lazily and holds its path exclusively.


def test_local_store_opens_nothing_until_used(tmp_path: Path) -> None:
    store = QdrantVectorStore(path=tmp_path / "qdrant")

    assert not (tmp_path / "qdrant").exists()
    assert store.list_collections() == []
    assert (tmp_path / "qdrant").exists()
    store.close()


def test_a_second_store_on_one_path_is_refused(tmp_path: Path) -> None:
    # Given a store that has opened its path
    first = QdrantVectorStore(path=tmp_path / "qdrant")
    first.ensure_collection("Entity_name", 2)
    second = QdrantVectorStore(path=tmp_path / "qdrant")

    # When a second store on the same path is used, it is refused with a clear reason
    with pytest.raises(StoreError, match="held by another client"):
        second.list_collections()

    # Then once the first closes, the second opens and sees the data
    first.close()
    assert second.list_collections() == ["Entity_name"]
    second.close()


def test_a_path_held_by_another_process_is_refused(tmp_path: Path) -> None:
    # Given another process holding the local path until told to stop
    path = tmp_path / "qdrant"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from qdrant_client import QdrantClient; "
            f"c = QdrantClient(path={str(path)!r}); print('ready', flush=True); "
            "sys.stdin.readline(); c.close()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"

        # When this process opens a store on it, it is refused
        with pytest.raises(StoreError, match="held by another client"):
            QdrantVectorStore(path=path).count(SCOPE, "Entity_name")
    finally:
        holder.communicate("stop\n", timeout=30)


def test_local_data_survives_reopening(tmp_path: Path) -> None:
    store = QdrantVectorStore(path=tmp_path / "qdrant")
    store.ensure_collection("Entity_name", 2)
    store.upsert(SCOPE, "Entity_name", [point("a", [1.0, 0.0], name="Ada")])
    store.close()

    reopened = QdrantVectorStore(path=tmp_path / "qdrant")
    with pytest.raises(DimensionMismatch):
        reopened.ensure_collection("Entity_name", 3)
    assert reopened.search(SCOPE, "Entity_name", [1.0, 0.0], limit=1)[0].payload["name"] == "Ada"
    reopened.close()


# Qdrant server mode: failures reach callers as store errors, transient ones marked so.


@contextmanager
def failing_server(status: int) -> Iterator[str]:
    """A stand-in server on 127.0.0.1 that answers every request with `status`."""

    class Handler(BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = b'{"status": {"error": "stand-in failure"}, "time": 0.0}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize(("status", "error"), [(503, TransientStoreError), (400, StoreError)])
def test_server_failures_become_store_errors(status: int, error: type[StoreError]) -> None:
    with failing_server(status) as url:
        store = QdrantVectorStore(url=url, timeout=5, check_version=False)
        with pytest.raises(error, match=str(status)) as raised:
            store.ensure_collection("Entity_name", 2)
        store.close()

    assert isinstance(raised.value, TransientStoreError) == (status == 503)


def test_an_unreachable_server_is_a_transient_error() -> None:
    store = QdrantVectorStore(url=f"http://127.0.0.1:{free_port()}", timeout=5, check_version=False)

    with pytest.raises(TransientStoreError, match="could not search"):
        store.search(SCOPE, "Entity_name", [1.0, 0.0], limit=1)
    store.close()


def test_delete_removes_only_those_ids_of_the_scope(store: VectorStore, prefix: str) -> None:
    # Given points in two scopes (point ids are unique across scopes, as data point ids are)
    name = prefix + "Entity_name"
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point("a", [1.0, 0.0]), point("b", [0.0, 1.0])])
    store.upsert(OTHER, name, [point("c", [1.0, 0.0])])

    # When one scope deletes "a", an id it never had, and the other scope's "c"
    ids = [stable_id("test", key) for key in ("a", "never", "c")]
    store.delete(SCOPE, name, ids)
    store.delete(SCOPE, prefix + "Unknown_text", ids)

    # Then only its own "a" is gone
    assert [h.id for h in store.search(SCOPE, name, [1.0, 0.0], limit=5)] == [stable_id("test", "b")]
    assert store.count(OTHER, name) == 1


def test_set_payload_merges_into_the_scopes_points_only(store: VectorStore, prefix: str) -> None:
    name = prefix + "DocumentChunk_text"
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point("a", [1.0, 0.0], text="kept")])
    store.upsert(OTHER, name, [point("c", [1.0, 0.0], text="other")])

    patch = {stable_id("test", "a"): {"weight": 0.8}, stable_id("test", "c"): {"weight": 0.1}}
    store.set_payload(SCOPE, name, patch)

    [hit] = store.search(SCOPE, name, [1.0, 0.0], limit=5)
    assert hit.payload["weight"] == 0.8 and hit.payload["text"] == "kept"
    [other] = store.search(OTHER, name, [1.0, 0.0], limit=5)
    assert "weight" not in other.payload


def test_retrieve_reads_the_scopes_points_by_id(store: VectorStore, prefix: str) -> None:
    # Given points in two scopes
    name = prefix + "ConversationTurn_text"
    store.ensure_collection(name, 2)
    store.upsert(SCOPE, name, [point("a", [3.0, 4.0], text="mine", next="b"), point("b", [0.0, 1.0])])
    store.upsert(OTHER, name, [point("c", [1.0, 0.0], text="theirs")])

    # When one scope reads "a", an id it never had, and the other scope's "c"
    ids = [stable_id("test", key) for key in ("a", "never", "c")]
    found = store.retrieve(SCOPE, name, ids)
    only_text = store.retrieve(SCOPE, name, ids, fields=["text"])

    # Then only its own "a" comes back, with its (normalized) vector and payload
    [mine] = found
    assert mine.id == stable_id("test", "a")
    assert np.allclose(mine.vector, [0.6, 0.8], atol=1e-6)
    assert mine.payload["text"] == "mine" and mine.payload["next"] == "b"
    assert mine.payload["tenant"] == SCOPE.tenant and mine.payload["dataset"] == SCOPE.dataset
    assert [p.id for p in only_text] == [mine.id] and "next" not in only_text[0].payload
    assert store.retrieve(SCOPE, prefix + "Unknown_text", ids) == []
    assert store.retrieve(SCOPE, name, []) == []
