"""Forget leaves no residue: nothing derived from a forgotten item keeps its words, neither the
session entries it was remembered through nor the descriptions of the entities it shared."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kenning.pipeline.ingest import text_source
from kenning.pipeline.models import DataItem, Dataset, Scope
from kenning.pipeline.permission import User, issue_key
from kenning.pipeline.session import SessionEntry
from kenning.retrieval.turn_cache import STAMP
from kenning.storage.coordination.forget_marks_redis import RedisForgetMark
from kenning.storage.coordination.redis_client import open_redis
from kenning.storage.inference.embedder import CachingEmbedder
from kenning.workers.api import create_app
from kenning.workers.application.lifecycle import Message
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring
from tests.integration.test_improve import ScriptedExtractor
from tests.services import REDIS_URL, ensure_services
from tests.unit.test_embedder import CountingEmbedder

# --- Session entries -------------------------------------------------------------------------


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.redis)])
def session_stores(request: pytest.FixtureRequest) -> dict[str, str]:
    """Where sessions live: files in the home, or Redis under a prefix of this test's own."""
    if request.param == "file":
        return {"session_backend": "file"}
    url: str = request.getfixturevalue("redis_url")
    return {
        "session_backend": "redis",
        "redis_url": url,
        "queue_prefix": f"kenning-residue-{uuid.uuid4().hex[:8]}",
    }


def open_memory(home: Path, tenant: str, **settings: str) -> Kenning:
    return Kenning(load_settings(home=home, tenant=tenant, embedding_provider="hash", **settings))


def operator_key(kenning: Kenning) -> str:
    """A key of the operator's own user: over HTTP, the same sessions as in Python."""
    user = User(tenant=kenning.settings.tenant, name=kenning.settings.user, admin=True)
    token, key = issue_key(user)
    kenning.wiring.permissions.add_user(user)
    kenning.wiring.permissions.add_key(key)
    return token


def session_text(kenning: Kenning, token: str, session_id: str) -> str:
    """Every entry of the session, as Python and as HTTP give it."""
    entries = kenning.get_session(session_id)
    with TestClient(create_app(kenning)) as client:
        answer = client.get(f"/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return "\n".join([*(entry.model_dump_json() for entry in entries), answer.text])


@pytest.mark.parametrize("how", ["item", "dataset", "everything"])
def test_forget_removes_the_session_entries_of_what_it_forgets(
    tmp_path: Path, session_stores: dict[str, str], how: str
) -> None:
    # Given a secret and a harmless message remembered into a session (the graph follows them)
    secret = f"My bank PIN is 4321-{uuid.uuid4().hex[:8]}"
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    home = tmp_path / "home"
    with open_memory(home, tenant, **session_stores) as kenning:
        kenning.remember([{"speaker": "Ada", "text": secret}], "chat", session_id="s1")
        kenning.remember([{"speaker": "Ada", "text": "The weather is mild."}], "chat", session_id="s1")
    with open_memory(home, tenant, **session_stores) as kenning:
        dataset = kenning.wiring.metadata.get_dataset(kenning.scope("chat"))
        assert dataset is not None
        items = {item.id: item for item in kenning.wiring.metadata.list_items(dataset.id)}
        [secret_id] = [
            i for i, item in items.items() if secret.encode() in kenning.wiring.blobs.get(item.content_hash)
        ]
        # And an answer that read the secret's item, and one that read only the dataset
        assert kenning.wiring.sessions is not None
        key = kenning.session_key("s1")
        cited = SessionEntry(
            kind="qa", question="PIN?", answer=secret, data_ids=[secret_id], datasets=["chat"]
        )
        kenning.wiring.sessions.append(key, cited)
        if how != "item":
            read = SessionEntry(
                kind="qa", question="What PIN?", answer=secret, datasets=["chat"], dataset="chat"
            )
            kenning.wiring.sessions.append(key, read)
        token = operator_key(kenning)
        assert secret in session_text(kenning, token, "s1")

        # When the item, the dataset or everything is forgotten
        if how == "item":
            kenning.forget("chat", [secret_id])
        elif how == "dataset":
            kenning.forget("chat")
        else:
            kenning.forget(everything=True)

        # Then no session entry holds the secret, nor does recall bring it back
        assert secret not in session_text(kenning, token, "s1")
        if how == "item":
            assert "weather is mild" in session_text(kenning, token, "s1")
            recalled = kenning.recall("bank PIN", ["chat"], session_id="s1")
            assert all(secret not in r.text for r in recalled.results)
        kenning.wiring.sessions.delete_session(key)


# --- Descriptions rebuilt from what remains ------------------------------------------------------

# Ada Quist and Oslo are in a and b, Ada Quist and Bruno Vex in b and c: each of them was
# described by more than one item, and by b (whose item id is made the smallest) at first.
TEXTS = {
    "a": "Ada Quist lives in Oslo. Oslo Harbour Company employs Ada Quist.",
    "b": "Ada Quist hid the stolen diamonds in Oslo. Bruno Vex helped Ada Quist with the stolen diamonds.",
    "c": "Bruno Vex met Ada Quist in Bergen. Oslo Harbour Company hired Bruno Vex.",
}
DATASET = "residue"


def tenant_where_b_comes_first(contents: dict[str, bytes]) -> str:
    """A tenant under which b's item id is the smallest: b's words described every entity it shares."""
    prefix = uuid.uuid4().hex[:6]
    for n in itertools.count():
        dataset = Dataset.of(Scope(tenant=f"t-{prefix}-{n}", dataset=DATASET))
        ids = {key: DataItem.of(dataset, key, key, data).id for key, data in contents.items()}
        if ids["b"] == min(ids.values()):
            return dataset.tenant
    raise AssertionError("unreachable")


@pytest.fixture(params=["sqlite", "postgres"])
def metadata(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {}
        return
    url: str = request.getfixturevalue("postgres_url")
    yield {"metadata_url": url}


def ingest(kenning: Kenning, keys: list[str]) -> dict[str, str]:
    ids = {}
    for key in keys:
        ids[key] = kenning.add([text_source(TEXTS[key], name=key, external_id=key)], DATASET).added[0].id
    assert kenning.cognify(DATASET).status.value == "completed"
    return ids


# When and by which run a node was written is no word of any item: the clean ingest is another run.
RUN_FIELDS = ("source_run", "created_at", "updated_at")


def stores(kenning: Kenning, point_ids: list[str]) -> dict[str, Any]:
    """Every node and edge (id, type, properties, data ids); every vector collection's count and
    the points (id, payload) among `point_ids` (a point's id is its node's or edge's)."""
    scope = kenning.scope(DATASET)
    nodes, edges = kenning.wiring.graph.export(scope)
    graph = {node.id: (node.type, _without_run(node.properties), sorted(node.data_ids)) for node in nodes} | {
        edge.id: (
            edge.source_id,
            edge.target_id,
            edge.relationship,
            _untimed(edge.properties),
            sorted(edge.data_ids),
        )
        for edge in edges
    }
    points: dict[str, Any] = {}
    vectors = kenning.wiring.vectors
    for name in vectors.list_collections():
        found = vectors.retrieve(scope, name, point_ids)
        # A turn's stamp marks each write of it (kenning.retrieval.turn_cache): no two ingests share one.
        payloads = {
            point.id: _untimed({k: v for k, v in point.payload.items() if k != STAMP}) for point in found
        }
        points[name] = (vectors.count(scope, name), payloads)
    return {"graph": graph, "points": points}


def _untimed(value: Any) -> Any:
    """Without the instants items were added at (a fact's time when its text gives none), which
    differ between two ingests of the same texts; which statement set each bound stays."""
    if isinstance(value, dict):
        return {key: _untimed(item) for key, item in value.items() if not _added_at(item)}
    if isinstance(value, list):
        return [_untimed(item) for item in value]
    return value


def _added_at(value: Any) -> bool:
    return isinstance(value, str) and len(value) > 19 and value[10:11] == "T" and value.endswith("Z")


def element_ids(kenning: Kenning) -> list[str]:
    nodes, edges = kenning.wiring.graph.export(kenning.scope(DATASET))
    return sorted({*(node.id for node in nodes), *(edge.id for edge in edges)})


def _without_run(properties: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in properties.items() if key not in RUN_FIELDS}


def test_forget_rebuilds_what_remains_as_a_clean_ingest_of_it(
    tmp_path: Path, metadata: dict[str, str]
) -> None:
    # Given a clean ingest of a and c, and one of a, b and c in which b described the shared entities
    tenant = tenant_where_b_comes_first({key: text.encode() for key, text in TEXTS.items()})
    with open_memory(tmp_path / "home", tenant, **metadata) as kenning:
        ids = ingest(kenning, ["a", "b", "c"])
        every_id = element_ids(kenning)
        assert "stolen diamonds" in str(stores(kenning, every_id))
        with open_memory(tmp_path / "clean", tenant) as clean:
            ingest(clean, ["a", "c"])
            expected = stores(clean, every_id)

        # When b is forgotten
        kenning.forget(DATASET, [ids["b"]])

        # Then b's words are nowhere, and every store holds what the clean ingest holds, field by field
        found = stores(kenning, every_id)
        assert "stolen diamonds" not in str(found)
        assert found["graph"] == expected["graph"]
        assert found["points"] == expected["points"]
        assert any(payloads for _, payloads in found["points"].values())


CONVERSATION = {
    "a": {"speaker": "Ada Quist", "text": "I moved to Oslo last spring.", "id": "m-a"},
    "b": {"speaker": "Ada Quist", "text": "I hid the stolen diamonds under Oslo Bridge.", "id": "m-b"},
    "c": {"speaker": "Bruno Vex", "text": "Ada Quist showed me Oslo Bridge.", "id": "m-c"},
}


def test_forgetting_a_message_rebuilds_the_conversation_as_if_never_said(tmp_path: Path) -> None:
    # Given a conversation remembered with and without its second message (which described first)
    said_as = {
        key: Message.model_validate(message).as_text().encode() for key, message in CONVERSATION.items()
    }
    tenant = tenant_where_b_comes_first(said_as)
    with open_memory(tmp_path / "home", tenant) as kenning:
        added = kenning.remember(list(CONVERSATION.values()), DATASET)
        every_id = element_ids(kenning)
        with open_memory(tmp_path / "clean", tenant) as clean:
            clean.remember([CONVERSATION["a"], CONVERSATION["c"]], DATASET)
            expected = stores(clean, every_id)
        items = kenning.wiring.metadata.get_items(added.item_ids)
        [second] = [item.id for item in items if item.source == "id:m-b"]

        # When the second message is forgotten
        kenning.forget(DATASET, [second])

        # Then the graph and every collection of graph elements is the conversation without it
        found = stores(kenning, every_id)
        assert "stolen diamonds" not in str(found)
        assert found["graph"] == expected["graph"]
        assert found["points"] == expected["points"]


def test_an_update_rebuilds_what_the_old_version_described(tmp_path: Path) -> None:
    # Given a, b and c cognified, b described the shared entities first
    tenant = tenant_where_b_comes_first({key: text.encode() for key, text in TEXTS.items()})
    harmless = "Ada Quist sold a bicycle in Oslo."
    with open_memory(tmp_path / "home", tenant) as kenning:
        ingest(kenning, ["a", "b", "c"])
        every_id = element_ids(kenning)

        # When b is rewritten and cognified again
        kenning.add([text_source(harmless, name="b", external_id="b")], DATASET)
        assert kenning.cognify(DATASET).status.value == "completed"
        every_id = sorted({*every_id, *element_ids(kenning)})

        # Then the stores are those of a clean ingest of a, the new b and c
        with open_memory(tmp_path / "clean", tenant) as clean:
            for key, text in [("a", TEXTS["a"]), ("b", harmless), ("c", TEXTS["c"])]:
                clean.add([text_source(text, name=key, external_id=key)], DATASET)
            assert clean.cognify(DATASET).status.value == "completed"
            expected = stores(clean, every_id)
        found = stores(kenning, every_id)
        assert "stolen diamonds" not in str(found)
        assert found == expected


def test_forget_after_improve_leaves_no_merged_name_of_the_forgotten_item(tmp_path: Path) -> None:
    # Given one text naming New York City, another naming it NYC, merged by improve into the first
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    with Kenning(settings, Wiring(settings, {"extractor": ScriptedExtractor()})) as kenning:
        first = kenning.add_text("Maria Lopez moved to New York City in 2019.", "city", name="one")
        kenning.add_text("Maria Lopez loves NYC and Boston.", "city", name="two")
        kenning.cognify("city")
        assert kenning.improve("city").merged_entities == 1

        # When the first text is forgotten
        kenning.forget("city", [first.added[0].id])

        # Then neither its name of the city nor its words are anywhere in the graph or its points
        nodes, edges = kenning.wiring.graph.export(kenning.scope("city"))
        ids = sorted({*(node.id for node in nodes), *(edge.id for edge in edges)})
        vectors = kenning.wiring.vectors
        points = [vectors.retrieve(kenning.scope("city"), name, ids) for name in vectors.list_collections()]
        left = str([nodes, edges, points])
        assert "New York City" not in left and "2019" not in left
        assert "NYC" in left


def test_forget_drops_the_vectors_its_process_kept_of_embedded_texts(tmp_path: Path) -> None:
    # Given a document cognified in this process, whose texts' vectors its embedder keeps
    with open_memory(tmp_path / "home", "residue-cache") as kenning:
        ids = ingest(kenning, ["b"])
        embedder = kenning.wiring.embedder
        assert isinstance(embedder, CachingEmbedder) and embedder.size_bytes > 0
        probe = "stolen diamonds"
        embedder.embed([probe])
        hits = embedder.hits
        embedder.embed([probe])
        assert embedder.hits == hits + 1
        # When it is forgotten
        kenning.forget(DATASET, [ids["b"]])
        # Then no vector is kept: the next embed of a text it held is computed again
        misses = embedder.misses
        embedder.embed([probe])
        assert embedder.misses == misses + 1


def test_a_forget_in_one_process_drops_the_embeddings_another_keeps(tmp_path: Path) -> None:
    # Given two processes on one home (say `kenning serve` and a `kenning forget` beside it),
    # the first having embedded a text it keeps
    with open_memory(tmp_path / "home", "residue-mark") as serving:
        ids = ingest(serving, ["b"])
        embedder = serving.wiring.embedder
        assert isinstance(embedder, CachingEmbedder)
        embedder.embed(["stolen diamonds"])
        with open_memory(tmp_path / "home", "residue-mark") as forgetting:
            # When the other forgets the document
            forgetting.forget(DATASET, [ids["b"]])
        # Then the first embeds the text again at its next call: it kept nothing of it
        misses = embedder.misses
        embedder.embed(["stolen diamonds"])
        assert embedder.misses == misses + 1


@pytest.mark.redis
def test_every_process_of_a_deployment_follows_its_redis_forget_mark() -> None:
    # Given a worker's embedder cache following its deployment's mark in Redis, a text in it
    ensure_services()
    client = open_redis(REDIS_URL)
    key = f"kenning-test-{uuid.uuid4().hex[:8]}:forgets"
    try:
        mark = RedisForgetMark(client, key)
        inner = CountingEmbedder()
        worker = CachingEmbedder(inner, forgets=mark.current)
        worker.embed(["stolen diamonds"])
        worker.embed(["stolen diamonds"])
        assert len(inner.calls) == 1
        # When a forget anywhere advances it
        RedisForgetMark(client, key).advance()
        # Then the worker's cache is emptied before its next call
        worker.embed(["stolen diamonds"])
        assert len(inner.calls) == 2
    finally:
        client.delete(key)
        client.close()
