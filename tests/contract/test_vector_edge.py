"""Qdrant Edge beyond the shared contract: opening, indexing, sharing a path, importing local mode."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qdrant_edge as qe

from kenning.pipeline.errors import DimensionMismatch, StoreError, TransientStoreError
from kenning.pipeline.models import Scope, ScoredPoint, VectorPoint, stable_id
from kenning.storage.vectors import holder as vector_holder
from kenning.storage.vectors.edge import EdgeVectorStore
from kenning.storage.vectors.local_import import import_local_qdrant
from kenning.storage.vectors.qdrant import QdrantVectorStore
from kenning.storage.vectors.shard_server import SearchServer, search_remotely

SCOPE = Scope(tenant="acme", dataset="papers")


def point(key: str, vector: list[float], **payload: object) -> VectorPoint:
    return VectorPoint(id=stable_id("test", key), vector=vector, payload=dict(payload))


def run_python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


WRITER = """
    import sys
    from kenning.pipeline.models import Scope, VectorPoint, stable_id
    from kenning.storage.vectors.edge import EdgeVectorStore

    path, dataset, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = EdgeVectorStore(path)
    scope = Scope(tenant="acme", dataset=dataset)
    store.ensure_collection("Entity_name", 4)
    for i in range(0, count, 10):
        batch = [
            VectorPoint(id=stable_id(dataset, str(j)), vector=[1.0, j / count, 0.5, 0.0], payload={"n": j})
            for j in range(i, min(i + 10, count))
        ]
        store.upsert(scope, "Entity_name", batch)
        assert store.search(scope, "Entity_name", [1.0, 0.0, 0.5, 0.0], limit=3)
    print(store.count(scope, "Entity_name"), flush=True)
    if len(sys.argv) > 4:
        sys.stdin.readline()
    store.close()
"""


def test_nothing_is_opened_until_used(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "vectors")

    assert store.list_collections() == []
    assert store.search(SCOPE, "Entity_name", [1.0, 0.0], limit=3) == []
    assert not (tmp_path / "vectors").exists()

    store.ensure_collection("Entity_name", 2)
    assert (tmp_path / "vectors" / "Entity_name" / "collection.json").is_file()
    store.close()


def test_data_survives_reopening_and_keeps_its_dimension(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "vectors")
    store.ensure_collection("Entity_name", 2)
    store.upsert(SCOPE, "Entity_name", [point("a", [1.0, 0.0], name="Ada")])
    store.close()

    reopened = EdgeVectorStore(tmp_path / "vectors")
    with pytest.raises(DimensionMismatch):
        reopened.ensure_collection("Entity_name", 3)
    assert reopened.search(SCOPE, "Entity_name", [1.0, 0.0], limit=1)[0].payload["name"] == "Ada"
    reopened.close()


def engine_search_threads() -> set[str]:
    """This process's live threads of the engine's search pools, by thread id (Linux)."""
    tasks = Path("/proc/self/task")
    found = set()
    for task in tasks.iterdir():
        try:
            if (task / "comm").read_text().startswith("edge-search"):
                found.add(task.name)
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through Linux /proc")
def test_a_collection_is_searched_on_one_engine_thread_also_one_made_before(tmp_path: Path) -> None:
    """A pool sized by the CPUs cost a search up to twice its CPU in threads handing work over."""
    store = EdgeVectorStore(tmp_path / "vectors")
    store.ensure_collection("Entity_name", 2)
    store.upsert(SCOPE, "Entity_name", [point(str(n), [1.0, n / 40]) for n in range(40)])
    store.close()
    # As an earlier kenning left it: the engine's own choice of search threads, by the CPUs.
    config = tmp_path / "vectors" / "Entity_name" / "shard" / "edge_config.json"
    recorded = json.loads(config.read_text())
    recorded.pop("max_search_threads", None)
    config.write_text(json.dumps(recorded))
    before = engine_search_threads()

    reopened = EdgeVectorStore(tmp_path / "vectors")
    for n in range(20):
        assert len(reopened.search(SCOPE, "Entity_name", [1.0, n / 20], limit=5)) == 5

    assert len(engine_search_threads() - before) == 1
    reopened.close()


def test_collection_names_must_be_plain_file_names(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "vectors")

    for name in ("../escape", ".hidden", "a/b", ""):
        with pytest.raises(StoreError, match="plain file name"):
            store.ensure_collection(name, 2)


def test_two_stores_on_one_path_take_turns(tmp_path: Path) -> None:
    # Given two stores on one path, each writing in turn while the other still has it open
    first = EdgeVectorStore(tmp_path / "vectors")
    second = EdgeVectorStore(tmp_path / "vectors")
    first.ensure_collection("Entity_name", 2)
    second.ensure_collection("Entity_name", 2)
    for i in range(5):
        first.upsert(SCOPE, "Entity_name", [point(f"first{i}", [1.0, i / 10])])
        second.upsert(SCOPE, "Entity_name", [point(f"second{i}", [i / 10, 1.0])])

        # Then each sees every write made so far, its own and the other's
        assert first.count(SCOPE, "Entity_name") == second.count(SCOPE, "Entity_name") == 2 * (i + 1)
    first.close()
    second.close()


def test_processes_writing_one_collection_lose_nothing(tmp_path: Path) -> None:
    # Given three processes writing 200 points each, ten at a time, to one collection
    path = str(tmp_path / "vectors")
    writers = [run_python(WRITER, path, f"d{n}", "200") for n in range(3)]

    # When this process searches it meanwhile
    store = EdgeVectorStore(path)
    while any(w.poll() is None for w in writers):
        store.search(SCOPE, "Entity_name", [1.0, 0.0, 0.5, 0.0], limit=5)
        time.sleep(0.01)

    # Then every writer succeeded and every point is there, once
    for writer in writers:
        out, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
        assert out.strip() == "200"
    assert [store.count(Scope(tenant="acme", dataset=f"d{n}"), "Entity_name") for n in range(3)] == [200] * 3
    assert len(store.point_ids("Entity_name")) == 600
    store.close()


def test_an_idle_holder_lets_go_when_another_process_asks(tmp_path: Path) -> None:
    # Given another process that wrote and keeps its store open, idle, until told to stop
    path = str(tmp_path / "vectors")
    holder = run_python(WRITER, path, "theirs", "20", "hold")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "20"

        # When this process reads and writes the same collection, it does so at once
        store = EdgeVectorStore(path, lock_timeout_s=10)
        started = time.monotonic()
        assert store.count(Scope(tenant="acme", dataset="theirs"), "Entity_name") == 20
        store.upsert(SCOPE, "Entity_name", [point("mine", [1.0, 0.0, 0.0, 0.0])])
        assert time.monotonic() - started < 5
        store.close()
    finally:
        holder.communicate("stop\n", timeout=60)
    assert holder.returncode == 0


SLEEPY_HOLDER = """
    import sys, time
    from kenning.pipeline.models import Scope, VectorPoint, stable_id
    from kenning.storage.vectors import holder as vector_holder
    from kenning.storage.vectors.edge import EdgeVectorStore

    vector_holder.IDLE_WAIT_S = 600.0  # a releaser asleep would not look again during the test
    store = EdgeVectorStore(sys.argv[1])
    store._shard("Entity_name")  # the releaser starts, finds nothing open, and sleeps
    time.sleep(0.3)
    store.ensure_collection("Entity_name", 4)
    store.upsert(Scope(tenant="acme", dataset="theirs"), "Entity_name", [
        VectorPoint(id=stable_id("theirs", "a"), vector=[1.0, 0.0, 0.5, 0.0])
    ])
    print("held", flush=True)
    sys.stdin.readline()
    store.close()
"""


def test_a_holder_whose_releaser_slept_while_it_held_nothing_still_lets_go(tmp_path: Path) -> None:
    # Given another process whose store held no collection at first (its releaser asleep), then
    # opened one, wrote, and keeps it open, idle
    path = str(tmp_path / "vectors")
    holder = run_python(SLEEPY_HOLDER, path)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"

        # When this process needs the collection, it gets it: opening it woke the holder's releaser
        store = EdgeVectorStore(path, lock_timeout_s=30)
        store.upsert(SCOPE, "Entity_name", [point("mine", [1.0, 0.0, 0.0, 0.0])])
        assert store.count(SCOPE, "Entity_name") == 1
        store.close()
    finally:
        holder.communicate("stop\n", timeout=60)
    assert holder.returncode == 0


def test_a_collection_whose_meta_file_is_not_an_object_is_a_store_error(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "vectors")
    store.ensure_collection("Entity_name", 2)
    store.close()
    (tmp_path / "vectors" / "Entity_name" / "collection.json").write_text("[]")

    reopened = EdgeVectorStore(tmp_path / "vectors")
    with pytest.raises(StoreError, match="collection.json"):
        reopened.search(SCOPE, "Entity_name", [1.0, 0.0], limit=1)
    reopened.close()


def test_the_releaser_outlives_an_os_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a store holding a collection, whose releaser's first look for waiting processes fails
    store = EdgeVectorStore(tmp_path / "vectors", linger_s=0.5)
    failures = iter([OSError("too many open files")])
    looks = vector_holder._others_waiting

    def others_waiting(folder: Path) -> bool:
        error = next(failures, None) if threading.current_thread().name == "kenning-vector-releaser" else None
        if error is not None:
            raise error
        return looks(folder)

    monkeypatch.setattr(vector_holder, "_others_waiting", others_waiting)
    monkeypatch.setattr(vector_holder, "POLL_S", 0.01)
    store.ensure_collection("Entity_name", 2)
    store.upsert(SCOPE, "Entity_name", [point("a", [1.0, 0.0])])
    # When it idles past its linger time, it still lets go (the releaser lived on)
    shard = store._shard("Entity_name")
    deadline = time.monotonic() + 30
    while shard.is_open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not shard.is_open
    store.close()


def test_a_collection_held_too_long_is_a_transient_error(tmp_path: Path) -> None:
    # Given a collection whose lock someone holds and never offers
    store = EdgeVectorStore(tmp_path / "vectors", lock_timeout_s=0.3)
    store.ensure_collection("Entity_name", 2)
    store.close()
    descriptor = os.open(tmp_path / "vectors" / "Entity_name" / ".lock", os.O_RDWR)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    try:
        # When this store needs it, it gives up after its timeout with a transient error
        with pytest.raises(TransientStoreError, match="busy"):
            store.count(SCOPE, "Entity_name")
    finally:
        os.close(descriptor)

    # Then once the lock is free the store works again
    assert store.count(SCOPE, "Entity_name") == 0
    store.close()


def test_writes_of_a_killed_process_are_kept(tmp_path: Path) -> None:
    # Given a process that writes and dies without closing its store
    path = str(tmp_path / "vectors")
    code = WRITER.replace("    store.close()\n", "    import os; os._exit(0)\n")
    writer = run_python(code, path, "killed", "50")
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err

    # Then its points are all there for the next process
    store = EdgeVectorStore(path)
    assert store.count(Scope(tenant="acme", dataset="killed"), "Entity_name") == 50
    store.close()


def test_the_index_is_built_past_the_threshold_and_searches_stay_right(tmp_path: Path) -> None:
    # Given a store that indexes once 500 points are outside the index
    store = EdgeVectorStore(tmp_path / "vectors", index_threshold=500)
    store.ensure_collection("DocumentChunk_text", 16)
    vectors = np.random.default_rng(3).normal(size=(800, 16))

    # When 800 points are written
    store.upsert(
        SCOPE, "DocumentChunk_text", [point(str(i), list(map(float, v))) for i, v in enumerate(vectors)]
    )

    # Then each finds itself first, and the collection holds an HNSW index
    for i in (0, 399, 799):
        [hit] = store.search(SCOPE, "DocumentChunk_text", list(map(float, vectors[i])), limit=1)
        assert hit.id == stable_id("test", str(i))
    store.close()
    shard = qe.EdgeShard.load(str(tmp_path / "vectors" / "DocumentChunk_text" / "shard"))
    try:
        assert shard.info().indexed_vectors_count >= 500
    finally:
        shard.close()


def engine_calls(monkeypatch: pytest.MonkeyPatch, method: str, note: Callable[[Any], Any]) -> list[Any]:
    """What `note` makes of the last argument of each call of the engine's `method`, which still
    runs as it would."""
    calls: list[Any] = []
    real = getattr(qe.EdgeShard, method)
    monkeypatch.setattr(qe.EdgeShard, method, lambda *args: calls.append(note(args[-1])) or real(*args))
    return calls


def names_of_one_dataset(tmp_path: Path, count: int) -> EdgeVectorStore:
    """A store whose Entity_name collection holds `count` points of SCOPE, the first closest to
    [1, 0, 0.5, 0] and each next one farther."""
    store = EdgeVectorStore(tmp_path / "vectors")
    store.ensure_collection("Entity_name", 4)
    store.upsert(SCOPE, "Entity_name", [point(str(i), [1.0, i / 10, 0.5, 0.0]) for i in range(count)])
    return store


def test_searches_on_many_threads_keep_the_shard_when_no_other_process_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a store holding a collection open, a `.want` file left by an earlier wait, and a
    # count of the shard's openings
    store = names_of_one_dataset(tmp_path, 10)
    shard = store._shard("Entity_name")
    (shard.folder / ".want").touch()
    vector = [1.0, 0.0, 0.5, 0.0]
    store.search(SCOPE, "Entity_name", vector, limit=2)
    opened = engine_calls(monkeypatch, "load", lambda path: path)

    def searches() -> None:
        for _ in range(200):
            store.search(SCOPE, "Entity_name", vector, limit=2)

    # When 8 threads search it at once
    threads = [threading.Thread(target=searches) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # Then it stayed open here all along: no search took another's probe for a waiting process
    assert shard.is_open and opened == []
    store.close()


def test_a_collection_of_one_dataset_is_searched_without_the_scope_filter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a collection whose points are all one dataset's, and a record of the engine's queries
    store = names_of_one_dataset(tmp_path, 10)
    filters = engine_calls(monkeypatch, "query", lambda request: request.filter is not None)
    # When it is searched, then another dataset writes there and both are searched
    alone = store.search(SCOPE, "Entity_name", [1.0, 0.0, 0.5, 0.0], limit=3)
    other = Scope(tenant="acme", dataset="notes")
    store.upsert(other, "Entity_name", [point("n", [1.0, 0.0, 0.5, 0.0])])
    mixed = store.search(SCOPE, "Entity_name", [1.0, 0.0, 0.5, 0.0], limit=3)
    # Then the first search ran unfiltered, the later ones filtered, and each found its own points
    assert filters == [False, True]
    assert (
        [hit.id for hit in alone]
        == [hit.id for hit in mixed]
        == [stable_id("test", str(i)) for i in range(3)]
    )
    assert [hit.id for hit in store.search(other, "Entity_name", [1.0, 0.0, 0.5, 0.0], limit=3)] == [
        stable_id("test", "n")
    ]
    store.close()


def test_the_estimate_that_one_dataset_fills_a_collection_is_kept_until_a_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a collection of one dataset, and a count of the engine's estimates
    store = names_of_one_dataset(tmp_path, 10)
    estimates = engine_calls(monkeypatch, "count", lambda request: True)
    vector = [1.0, 0.0, 0.5, 0.0]
    # When it is searched twice, written to, then searched again
    store.search(SCOPE, "Entity_name", vector, limit=3)
    store.search(SCOPE, "Entity_name", vector, limit=3)
    asked_before_write = len(estimates)
    store.upsert(Scope(tenant="acme", dataset="notes"), "Entity_name", [point("n", vector)])
    after = store.search(SCOPE, "Entity_name", vector, limit=3)
    # Then the two searches asked once, the write made the next search ask again, and it kept to its scope
    assert (asked_before_write, len(estimates)) == (1, 2)
    assert [hit.id for hit in after] == [stable_id("test", str(i)) for i in range(3)]
    store.close()


@pytest.mark.parametrize(
    "theirs", [Scope(tenant="other", dataset="papers"), Scope(tenant="acme", dataset="notes")], ids=str
)
@pytest.mark.parametrize("fields", [None, ("n",)], ids=["all fields", "some fields"])
def test_an_unfiltered_search_that_finds_another_scopes_point_is_run_again_filtered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theirs: Scope, fields: tuple[str, ...] | None
) -> None:
    # Given two scopes in one collection (another tenant's, or another dataset of the same
    # tenant), the closest point the other's, with a payload field, and an estimate that
    # wrongly says every point is this dataset's (as a write racing the estimate would make it)
    store = names_of_one_dataset(tmp_path, 5)
    store.upsert(theirs, "Entity_name", [point("x", [1.0, 0.0, 0.5, 0.0], n=1)])
    monkeypatch.setattr(vector_holder, "_all_of_scope", lambda engine, scope: True)
    # When this dataset is searched
    hits = store.search(SCOPE, "Entity_name", [1.0, 0.0, 0.5, 0.0], limit=3, fields=fields)
    # Then only its own points come back, the closest first
    assert [hit.id for hit in hits] == [stable_id("test", str(i)) for i in range(3)]
    assert {(hit.payload["tenant"], hit.payload["dataset"]) for hit in hits} == {
        (SCOPE.tenant, SCOPE.dataset)
    }
    store.close()


def test_threads_share_one_open_shard(tmp_path: Path) -> None:
    # Given one store used by four threads at once, each writing and searching its own dataset
    store = EdgeVectorStore(tmp_path / "vectors")
    store.ensure_collection("Entity_name", 4)

    def work(n: int) -> None:
        scope = Scope(tenant="acme", dataset=f"t{n}")
        for i in range(0, 200, 5):
            batch = [point(f"{n}-{j}", [1.0, j / 200, n / 4, 0.5]) for j in range(i, i + 5)]
            store.upsert(scope, "Entity_name", batch)
            assert store.search(scope, "Entity_name", [1.0, 0.0, 0.0, 0.5], limit=3)

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(work, range(4)))

    # Then every write landed in its own dataset
    assert [store.count(Scope(tenant="acme", dataset=f"t{n}"), "Entity_name") for n in range(4)] == [200] * 4
    store.close()


def test_a_local_mode_folder_is_copied_over_once(tmp_path: Path) -> None:
    # Given vectors of two datasets written by qdrant-client local mode
    other = Scope(tenant="acme", dataset="letters")
    old = QdrantVectorStore(path=tmp_path / "qdrant")
    old.ensure_collection("Entity_name", 2)
    old.upsert(SCOPE, "Entity_name", [point("a", [1.0, 0.0], name="Ada"), point("b", [0.0, 1.0])])
    old.upsert(other, "Entity_name", [point("c", [1.0, 0.0], name="Cy")])
    old.close()

    # When they are imported into Qdrant Edge, twice
    store = EdgeVectorStore(tmp_path / "vectors")
    first = import_local_qdrant(tmp_path / "qdrant", store, tmp_path / "vectors")
    second = import_local_qdrant(tmp_path / "qdrant", store, tmp_path / "vectors")

    # Then every point is there once, in its own dataset, with its payload; the second did nothing
    assert (first, second) == (3, 0)
    assert (store.count(SCOPE, "Entity_name"), store.count(other, "Entity_name")) == (2, 1)
    [hit] = store.search(other, "Entity_name", [1.0, 0.0], limit=5)
    assert hit.id == stable_id("test", "c") and hit.payload == {"name": "Cy", **other.model_dump()}
    store.close()


def test_no_local_mode_folder_means_nothing_to_import(tmp_path: Path) -> None:
    store = EdgeVectorStore(tmp_path / "vectors")

    assert import_local_qdrant(tmp_path / "qdrant", store, tmp_path / "vectors") == 0
    assert store.list_collections() == []


def test_a_busy_process_still_hands_over(tmp_path: Path) -> None:
    # Given a process whose threads keep a collection busy without a pause between them
    path = tmp_path / "vectors"
    busy = EdgeVectorStore(path)
    busy.ensure_collection("Entity_name", 4)
    busy.upsert(SCOPE, "Entity_name", [point("a", [1.0, 0.0, 0.0, 0.0])])
    stop = threading.Event()

    def keep_busy() -> None:
        while not stop.is_set():
            busy.search(SCOPE, "Entity_name", [1.0, 0.0, 0.0, 0.0], limit=1)

    threads = [threading.Thread(target=keep_busy) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        # When another process writes to it
        writer = run_python(WRITER, str(path), "theirs", "20")
        out, err = writer.communicate(timeout=120)
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    # Then it gets its turns and finishes
    assert writer.returncode == 0, err
    assert out.strip() == "20"
    busy.close()


def test_a_holder_answers_other_processes_searches_and_keeps_the_shard(tmp_path: Path) -> None:
    # Given another process that wrote 20 points and keeps the collection open, idle
    path = tmp_path / "vectors"
    holder = run_python(WRITER, str(path), "theirs", "20", "hold")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "20"
        store = EdgeVectorStore(path, lock_timeout_s=10)
        theirs = Scope(tenant="acme", dataset="theirs")

        # When this process searches it
        hits = store.search(theirs, "Entity_name", [1.0, 0.0, 0.5, 0.0], limit=3, fields=["n"])

        # Then the holder answered: the closest points, with the fields asked for,
        assert [hit.payload["n"] for hit in hits] == [0, 1, 2]
        assert hits[0].score == pytest.approx(0.0, abs=1e-6)
        assert set(hits[0].payload) == {"n", "tenant", "dataset"}
        # within the asker's scope alone,
        assert store.search(SCOPE, "Entity_name", [1.0, 0.0, 0.5, 0.0], limit=3) == []
        assert store.search(Scope(tenant="other", dataset="theirs"), "Entity_name", [1.0, 0, 0.5, 0], 3) == []
        # and this process never opened the shard: the holder still holds its lock
        assert not store._shard("Entity_name").is_open
        descriptor = os.open(path / "Entity_name" / ".lock", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(descriptor)
        # and a write still takes the shard over, and is seen by the next search
        new = VectorPoint(id=stable_id("theirs", "new"), vector=[1.0, 0.0, 0.5, 0.0])
        store.upsert(theirs, "Entity_name", [new])
        assert store.count(theirs, "Entity_name") == 21
        store.close()
    finally:
        holder.communicate("stop\n", timeout=60)
    assert holder.returncode == 0


def test_the_socket_of_a_holder_that_died_is_passed_over(tmp_path: Path) -> None:
    # Given a collection whose last holder died and left its socket behind
    store = EdgeVectorStore(tmp_path / "vectors")
    store.ensure_collection("Entity_name", 2)
    store.upsert(SCOPE, "Entity_name", [point("a", [1.0, 0.0], name="Ada")])
    store.close()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "vectors" / "Entity_name" / ".sock"))
    stale.close()

    # When another store searches it, it opens the shard itself and finds the point
    reopened = EdgeVectorStore(tmp_path / "vectors")
    assert reopened.search(SCOPE, "Entity_name", [1.0, 0.0], limit=1)[0].payload["name"] == "Ada"

    # and now answers others in its turn, at a socket only its user may use
    socket_file = tmp_path / "vectors" / "Entity_name" / ".sock"
    assert stat.S_IMODE(socket_file.stat().st_mode) == 0o600
    hits = search_remotely(socket_file.parent, SCOPE, [1.0, 0.0], 1, None, timeout_s=10)
    assert hits is not None and hits[0].payload["name"] == "Ada"
    reopened.close()
    assert not socket_file.exists()


def test_a_search_server_that_cannot_answer_sends_the_asker_to_search_itself(tmp_path: Path) -> None:
    def refuse(scope: Scope, vector: object, limit: int, fields: object) -> list[ScoredPoint]:
        raise StoreError("not open here")

    server = SearchServer(tmp_path, refuse)
    server.start()
    try:
        assert search_remotely(tmp_path, SCOPE, [1.0], 1, None, timeout_s=10) is None
    finally:
        server.stop()
    assert search_remotely(tmp_path, SCOPE, [1.0], 1, None, timeout_s=10) is None


def test_a_collection_whose_socket_path_is_too_long_still_works(tmp_path: Path) -> None:
    # Given a home so deep that no Unix socket can be bound in its collections' folders
    deep = tmp_path / ("d" * 100)
    store = EdgeVectorStore(deep / "vectors")
    other = EdgeVectorStore(deep / "vectors")

    # When a store writes and searches, and another store on the same path searches
    store.ensure_collection("Entity_name", 2)
    store.upsert(SCOPE, "Entity_name", [point("a", [1.0, 0.0], name="Ada")])

    # Then both find the point: the other takes its turn on the shard, as without a socket
    assert store.search(SCOPE, "Entity_name", [1.0, 0.0], limit=1)[0].payload["name"] == "Ada"
    assert other.search(SCOPE, "Entity_name", [1.0, 0.0], limit=1)[0].payload["name"] == "Ada"
    assert not (deep / "vectors" / "Entity_name" / ".sock").exists()
    store.close()
    other.close()


def test_a_vector_of_numpy_numbers_is_asked_of_the_holder(tmp_path: Path) -> None:
    holder = EdgeVectorStore(tmp_path / "vectors")
    holder.ensure_collection("Entity_name", 2)
    holder.upsert(SCOPE, "Entity_name", [point("a", [1.0, 0.0], name="Ada")])
    asker = EdgeVectorStore(tmp_path / "vectors")

    hits = asker.search(SCOPE, "Entity_name", list(np.array([1.0, 0.0], dtype=np.float32)), limit=1)

    assert hits[0].payload["name"] == "Ada"
    assert holder._shard("Entity_name").is_open and not asker._shard("Entity_name").is_open
    holder.close()
    asker.close()


def test_erasing_rewrites_collections_so_deleted_payloads_leave_the_disk(tmp_path: Path) -> None:
    # Given a collection whose deleted point's payload still lies in the engine's files
    store = EdgeVectorStore(tmp_path)
    store.ensure_collection("Notes", 3)
    points = [point(f"p{n}", [1.0, float(n), 0.5], text=f"note {n}") for n in range(40)]
    points.append(point("secret", [0.0, 1.0, 1.0], text="qzx-erase-me"))
    store.upsert(SCOPE, "Notes", points)
    store.delete(SCOPE, "Notes", [points[-1].id])
    store.close()
    assert holding(tmp_path, b"qzx-erase-me")
    # When the store erases what was deleted
    assert store.erase_deleted(SCOPE) == 1
    # Then no file holds it, and every live point is there and found as before
    store.close()
    assert holding(tmp_path, b"qzx-erase-me") == []
    assert store.count(SCOPE, "Notes") == 40
    assert store.search(SCOPE, "Notes", [1.0, 3.0, 0.5], 1)[0].id == points[3].id
    assert store.retrieve(SCOPE, "Notes", [points[7].id])[0].payload["text"] == "note 7"
    store.close()


def test_a_rebuild_stopped_after_the_old_shard_moved_aside_is_completed(tmp_path: Path) -> None:
    # Given a rebuild that died between its two renames: the fresh shard is whole, the old aside
    store = EdgeVectorStore(tmp_path)
    store.ensure_collection("Notes", 3)
    store.upsert(SCOPE, "Notes", [point("a", [1.0, 0.0, 0.0], text="a")])
    store.close()
    folder = tmp_path / "Notes"
    shutil.copytree(folder / vector_holder.SHARD_DIR, folder / vector_holder.FRESH_DIR)
    os.replace(folder / vector_holder.SHARD_DIR, folder / vector_holder.OLD_DIR)
    # Then the next use finds the collection whole, with nothing left beside it
    assert store.count(SCOPE, "Notes") == 1
    store.close()
    assert sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")) == [
        "collection.json",
        vector_holder.SHARD_DIR,
    ]


def holding(root: Path, needle: bytes) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file() and needle in path.read_bytes()]
