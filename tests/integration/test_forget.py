"""Forget and update, embedded: provenance-exact removal from every store, shared facts kept."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kenning.pipeline import collection
from kenning.pipeline.errors import InputError
from kenning.pipeline.ingest import text_source
from kenning.pipeline.session import SessionEntry
from kenning.retrieval.contract import SearchType
from kenning.retrieval.registry import REGISTRY
from kenning.storage.sources.blob import FileBlobStore
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring

# Three items: "Falcon Dynamics" and "Boston" are shared; "Oliver Reed" and "zeppelin" only in B.
TEXTS = {
    "a": "Falcon Dynamics is based in Boston. Nora Blake leads the research team.",
    "b": "Oliver Reed is the CEO of Falcon Dynamics. Oliver Reed flies a zeppelin over Boston.",
    "c": "Maria Lopez joined Falcon Dynamics in Boston as an engineer.",
}


def memory(home: Path, **stores: str) -> Kenning:
    return Kenning(load_settings(home=home, embedding_provider="hash", session_backend="file", **stores))


@pytest.fixture(params=["sqlite+sql-graph", "postgres+falkordb"])
def stores(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """Where metadata and the graph live: the embedded default, or PostgreSQL and FalkorDB."""
    if request.param == "sqlite+sql-graph":
        yield {}
        return
    postgres: str = request.getfixturevalue("postgres_url")
    falkordb: str = request.getfixturevalue("falkordb_url")
    graph = f"kenning_forget_{uuid.uuid4().hex[:8]}"
    yield {"metadata_url": postgres, "graph_backend": "falkordb", "graph_url": falkordb, "graph_name": graph}


def ingest(kenning: Kenning, keys: list[str]) -> dict[str, str]:
    ids = {}
    for key in keys:
        ids[key] = kenning.add([text_source(TEXTS[key], name=key, external_id=key)], "news").added[0].id
    assert kenning.cognify("news").status.value == "completed"
    return ids


def snapshot(kenning: Kenning) -> dict[str, object]:
    """Everything a search can reach: graph ids with provenance, points per collection, lexical hits."""
    scope = kenning.scope("news")
    nodes, edges = kenning.wiring.graph.export(scope)
    names = [*collection.INDEXED, collection.TRIPLETS]
    return {
        "nodes": sorted(node.id for node in nodes),
        "edges": sorted(edge.id for edge in edges),
        "points": {name: kenning.wiring.vectors.count(scope, name) for name in names},
        "lexical": sorted(hit.id for hit in kenning.wiring.lexical.search(scope, "Falcon Boston", 50)),
    }


def every_result_text(kenning: Kenning, query: str) -> str:
    texts = []
    for search_type in REGISTRY:
        if search_type in (SearchType.CYPHER, SearchType.NATURAL_LANGUAGE):
            continue  # need a Cypher graph backend; covered by the Cypher isolation tests
        result = kenning.search(query, search_type, datasets=["news"], only_context=True)
        texts += [hit.text for hit in result.results] + [result.context]
    return "\n".join(texts)


def test_forget_leaves_exactly_a_clean_ingest_of_the_rest(tmp_path: Path, stores: dict[str, str]) -> None:
    # Given a clean ingest of a and c only (its own home, metadata and graph), and one of a, b and c
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    apart = {**stores, "graph_name": "clean_" + stores["graph_name"]} if "graph_name" in stores else {}
    apart.pop("metadata_url", None)
    with memory(tmp_path / "clean", tenant=tenant, **apart) as clean:
        ingest(clean, ["a", "c"])
        expected = snapshot(clean)
    with memory(tmp_path / "home", tenant=tenant, **stores) as kenning:
        ids = ingest(kenning, ["a", "b", "c"])
        kenning.search("Oliver Reed", "CHUNKS_LEXICAL", datasets=["news"])
        before = snapshot(kenning)

        # When b is forgotten
        [forgotten] = kenning.forget("news", [ids["b"]])

        # Then the stores hold what a clean ingest of a and c holds, id for id
        assert forgotten.items == [ids["b"]] and forgotten.nodes > 0
        assert snapshot(kenning) == expected != before
        # And no search type brings back anything only b said
        assert "Oliver" not in every_result_text(kenning, "Oliver Reed zeppelin CEO")
        assert "zeppelin" not in every_result_text(kenning, "zeppelin")
        # And shared facts survive
        assert "Falcon Dynamics" in every_result_text(kenning, "Falcon Dynamics Boston")
        # And the item, its bytes and its cached extractions are gone
        assert kenning.wiring.metadata.get_items([ids["b"]]) == []
        assert forgotten.blobs == 1 and forgotten.cache_entries >= 1


def test_an_edited_document_replaces_its_stale_facts(tmp_path: Path) -> None:
    # Given ceo.txt naming one CEO, cognified
    ceo = tmp_path / "ceo.txt"
    ceo.write_text("Oliver Reed is the CEO of Falcon Dynamics. Falcon Dynamics is based in Boston.")
    with memory(tmp_path / "home") as kenning:
        kenning.add_paths([str(ceo)], "news")
        kenning.cognify("news")

        # When the file is rewritten and added and cognified again
        ceo.write_text("Nora Blake is the CEO of Falcon Dynamics. Falcon Dynamics is based in Boston.")
        added = kenning.add_paths([str(ceo)], "news")
        assert len(added.superseded) == 1
        run = kenning.cognify("news")

        # Then the old CEO is gone, the new one is there, and the shared facts stay
        assert run.stats["superseded_items"] == 1
        found = every_result_text(kenning, "Who is the CEO of Falcon Dynamics?")
        assert "Oliver" not in found
        assert "Nora Blake" in found and "Boston" in found
        dataset = kenning.wiring.metadata.get_dataset(kenning.scope("news"))
        assert dataset is not None and len(kenning.wiring.metadata.list_items(dataset.id)) == 1


def test_forget_a_dataset_and_everything(tmp_path: Path) -> None:
    with memory(tmp_path / "home") as kenning:
        ingest(kenning, ["a", "b"])
        kenning.add_text("Another dataset's fact about Ada Lovelace.", "other")
        kenning.cognify("other")

        kenning.forget("news")
        assert [d.name for d in kenning.wiring.metadata.list_datasets(kenning.settings.tenant)] == ["other"]
        assert kenning.wiring.graph.counts(kenning.scope("news")) == (0, 0)
        assert kenning.search("Ada", "CHUNKS", datasets=["other"]).results

        kenning.forget(everything=True)
        assert kenning.wiring.metadata.list_datasets(kenning.settings.tenant) == []
        with pytest.raises(InputError, match=r"no dataset 'other' \(datasets: none\)"):
            kenning.search("Ada", "CHUNKS", datasets=["other"])
        with pytest.raises(InputError, match="no dataset 'news'"):
            kenning.forget("news")


def test_a_session_that_cited_forgotten_data_forgets_it_too(tmp_path: Path) -> None:
    with memory(tmp_path / "home") as kenning:
        ids = ingest(kenning, ["a", "b"])
        key = kenning.session_key("s1")
        kenning.wiring.sessions.append(  # type: ignore[union-attr]
            key,
            SessionEntry(kind="qa", question="Who is the CEO?", answer="Oliver Reed", data_ids=[ids["b"]]),
        )
        kenning.forget("news", [ids["b"]])
        recalled = kenning.recall("Oliver Reed CEO", ["news"], session_id="s1")
        assert all("Oliver" not in r.text for r in recalled.results)


def test_remember_and_recall_cite_where_each_result_came_from(tmp_path: Path) -> None:
    conversation = [
        {"speaker": "Caroline", "text": "I went to the support group yesterday.", "time": "2023-05-08T13:56"},
        {"speaker": "Melanie", "text": "I painted a sunrise over the lake.", "time": "2023-05-08T14:01"},
    ]
    with memory(tmp_path / "home") as kenning:
        # Without a session: in the graph at once
        done = kenning.remember(conversation, "chat")
        assert done.status == "completed" and len(done.item_ids) == 2
        # With a session: in the session at once, in the graph after the background cognify
        queued = kenning.remember("Melanie's cat is called Oliver.", "chat", session_id="s1")
        assert queued.status == "queued" and queued.session_entries
        recalled = kenning.recall("support group", ["chat"], session_id="s1")
        graph = [r for r in recalled.results if r.source == "graph"]
        assert graph and "Caroline" in graph[0].text and "2023-05-08" in graph[0].text and graph[0].data_id
        # (session and memory are ranked in one list: the message may come from both)
        cat = kenning.recall("cat called", ["chat"], session_id="s1").results
        said = [hit for hit in cat if hit.source == "session"]
        assert said and said[0].entry_id == queued.session_entries[0] and "Oliver" in said[0].text
    with memory(tmp_path / "home") as again:
        hits = again.recall("cat Oliver", ["chat"]).results
        assert any("cat" in hit.text for hit in hits)


def test_forget_through_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    runner = CliRunner()
    note = tmp_path / "note.txt"
    note.write_text("Oliver Reed flies a zeppelin.")
    assert runner.invoke(main, ["remember", str(note), "--dataset", "notes"]).exit_code == 0
    found = runner.invoke(main, ["recall", "zeppelin", "--dataset", "notes", "--json"])
    assert json.loads(found.output)["results"][0]["source"] == "graph"
    refused = runner.invoke(main, ["forget", "--dataset", "notes"])
    assert refused.exit_code != 0  # asks for --yes
    forgot = runner.invoke(main, ["forget", "--dataset", "notes", "--yes"])
    assert forgot.exit_code == 0
    # The command says what the erasure after the forget wiped, and where
    assert (
        "erased from disk and servers:" in forgot.output and "vector collections rewritten" in forgot.output
    )
    missing = runner.invoke(main, ["recall", "zeppelin", "--dataset", "notes", "--json"])
    assert isinstance(missing.exception, InputError) and "no dataset 'notes'" in str(missing.exception)


class GatedBlobs:
    """A blob store whose writes wait for `go` (at most GATE_S): the background add of a message
    held at the point where it has made its dataset but not yet written its item."""

    def __init__(self, inner: FileBlobStore, go: threading.Event) -> None:
        self._inner, self._go = inner, go

    def put(self, key: str, data: bytes) -> None:
        self._go.wait(GATE_S)
        self._inner.put(key, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


GATE_S = 3.0


def test_a_message_still_being_remembered_is_not_left_behind_by_a_forget(tmp_path: Path) -> None:
    # Given a message remembered with a session, its background add held before its bytes are written
    home, go = tmp_path / "home", threading.Event()
    settings = load_settings(home=home, embedding_provider="hash")
    blobs = GatedBlobs(FileBlobStore(home / "blobs"), go)
    with Kenning(settings, Wiring(settings, {"blobs": blobs})) as kenning:
        kenning.remember("Oliver Reed keeps his PIN 4321 in a zeppelin.", "news", session_id="s1")
        # When the dataset is forgotten meanwhile, and only then is the add let go
        kenning.forget("news")
        go.set()
    # Then no byte of the message is left anywhere in the home, nor a dataset to hold it
    with Kenning(settings) as kenning:
        assert kenning.wiring.metadata.list_datasets(settings.tenant) == []
        assert not any("4321" in entry.question for entry in kenning.get_session("s1"))
    assert [path for path in home.rglob("*") if path.is_file() and b"4321" in path.read_bytes()] == []


def test_recall_works_when_the_session_store_is_down(tmp_path: Path) -> None:
    # Given sessions in a Redis that is not there
    settings = load_settings(
        home=tmp_path / "home",
        embedding_provider="hash",
        session_backend="redis",
        redis_url="redis://127.0.0.1:1/0",
    )
    with Kenning(settings) as kenning:
        kenning.remember("Oliver Reed flies a zeppelin.", "news")
        # When an agent recalls within a session
        recalled = kenning.recall("zeppelin", ["news"], session_id="s1")
        # Then the graph answers, and the notice says the session memory is unavailable
        assert recalled.results and recalled.results[0].source == "graph"
        assert "session memory unavailable" in recalled.notice and recalled.entry_id is None


def test_forgetting_a_dataset_keeps_a_run_that_waits_for_it(tmp_path: Path) -> None:
    from kenning.pipeline.plan import start_run

    with memory(tmp_path / "home") as kenning:
        ingest(kenning, ["a"])
        # Given a run started (queued behind the lock) when the whole dataset is forgotten
        waiting = start_run(kenning.wiring, kenning.scope("news"))
        kenning.forget("news")
        # Then the run and its (now empty) dataset are still there for it to complete
        assert kenning.wiring.metadata.get_run(waiting.run_id) is not None
        assert kenning.wiring.metadata.get_dataset(kenning.scope("news")) is not None
        assert kenning.wiring.graph.counts(kenning.scope("news")) == (0, 0)


def test_remembering_a_device_into_a_session_is_refused_not_read_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    refused = CliRunner().invoke(main, ["remember", "/dev/zero", "--session", "s", "--dataset", "d"])
    # (run() turns a KenningError into one line and exit code 2; CliRunner shows the error itself)
    assert isinstance(refused.exception, InputError) and "not a regular file" in str(refused.exception)
