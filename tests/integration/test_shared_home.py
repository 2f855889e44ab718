"""Several processes on one embedded home: cognify runs of two datasets, searches and status at once.

The vectors live in Qdrant Edge under the home, which processes share by taking turns per
collection; SQLite and the dataset file locks are shared the same way. Every process must
succeed, and the memory they build together must be the one sequential runs build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.models import Scope
from kenning.storage.vectors.edge import EdgeVectorStore
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator

pytestmark = pytest.mark.slow

CITIES = ("Lisbon", "Porto", "Bergen", "Tromso", "Lyon", "Nantes", "Graz", "Basel")
DEADLINE_S = 420.0
# A slow LLM with few extractions in flight keeps A's cognify running for at least
# 300 / 4 * 0.3 s = 22 s on any machine, so readers always meet it mid-run.
SLOW_LATENCY_MS = 300.0
SLOW_CONCURRENCY = "4"


def write_corpus(folder: Path, prefix: str, count: int) -> Path:
    folder.mkdir(parents=True)
    for i in range(count):
        city = CITIES[i % len(CITIES)]
        (folder / f"{prefix}{i:03d}.txt").write_text(
            f"{prefix.title()} Walker {i} founded the {prefix.title()} Guild {i} in {city}. "
            f"The {prefix.title()} Guild {i} trained keepers of the {city} lighthouse."
        )
    return folder


def environment(home: Path, llm: Simulator) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KENNING_")}
    return {
        **env,
        "KENNING_HOME": str(home),
        "KENNING_EMBEDDING_PROVIDER": "hash",
        "KENNING_LLM_URL": llm.base_url,
        "KENNING_LLM_API_KEY": "test",
        "KENNING_CONCURRENCY": SLOW_CONCURRENCY,
    }


def kenning(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "kenning.workers.cli", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> str:
    try:
        out, err = process.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, f"{process.args} failed:\n{err}"
    return out


def search(env: dict[str, str], query: str, dataset: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        finish(kenning(env, "search", query, "--type", "CHUNKS", "--dataset", dataset, "--json"))
    )
    return found


def counts(home: Path, dataset: str) -> dict[str, Any]:
    """Items, graph size and vector points per collection of one dataset in a home."""
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        [status] = memory.status(dataset)
    vectors = EdgeVectorStore(home / "vectors")
    try:
        scope = Scope(tenant="default", dataset=dataset)
        points = {name: vectors.count(scope, name) for name in vectors.list_collections()}
    finally:
        vectors.close()
    return {"items": status["items"], "graph": status["graph"], "points": points}


@pytest.fixture
def llm() -> Iterator[Simulator]:
    with Simulator(latency_ms=SLOW_LATENCY_MS) as running:
        yield running


def test_cognify_two_datasets_while_searching_and_reading_status(tmp_path: Path, llm: Simulator) -> None:
    # Given a home with two datasets added: A of 300 small texts, B of 80, and a slow LLM
    home = tmp_path / "home"
    env = environment(home, llm)
    finish(kenning(env, "add", str(write_corpus(tmp_path / "a", "alpha", 300)), "--dataset", "alpha"))
    finish(kenning(env, "add", str(write_corpus(tmp_path / "b", "beta", 80)), "--dataset", "beta"))

    # When A is cognified, B is cognified beside it, and searches and status run meanwhile
    first = kenning(env, "cognify", "--dataset", "alpha")
    time.sleep(3)
    second = kenning(env, "cognify", "--dataset", "beta")
    readers = 0
    deadline = time.monotonic() + DEADLINE_S
    while first.poll() is None and time.monotonic() < deadline:
        for dataset in ("alpha", "beta"):
            assert search(env, "Guild lighthouse", dataset)["type"] == "CHUNKS"
        json.loads(finish(kenning(env, "status", "--json")))
        readers += 1

    # Then every process succeeded, and searches ran while A was still running
    finish(first)
    finish(second)
    assert readers >= 1
    hits = search(env, "Alpha Walker 7", "alpha")["results"]
    assert any("Alpha Walker 7 " in hit["text"] for hit in hits)

    # And each dataset holds what sequential runs of the same input make
    llm.latency_ms = 0.0
    sequential = tmp_path / "sequential"
    solo = environment(sequential, llm)
    finish(kenning(solo, "add", str(tmp_path / "a"), "--dataset", "alpha"))
    finish(kenning(solo, "add", str(tmp_path / "b"), "--dataset", "beta"))
    finish(kenning(solo, "cognify", "--dataset", "alpha"))
    finish(kenning(solo, "cognify", "--dataset", "beta"))
    for dataset in ("alpha", "beta"):
        together, alone = counts(home, dataset), counts(sequential, dataset)
        assert together == alone, dataset
        assert sum(together["points"].values()) > 0


def test_a_home_written_with_local_mode_keeps_its_vectors(tmp_path: Path) -> None:
    # Given a home cognified when vectors lived in qdrant-client local mode
    home = tmp_path / "home"
    with Kenning(load_settings(home=home, embedding_provider="hash", vector_backend="qdrant")) as memory:
        memory.add_text("Ada Lovelace wrote the first published algorithm.", "notes", name="ada")
        memory.cognify("notes")

    # When it is opened with the default engine
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        hits = memory.search("Ada Lovelace", "CHUNKS", datasets=["notes"]).results

    # Then its vectors have moved over to Qdrant Edge, and searches find them
    assert hits and "Ada Lovelace" in hits[0].text
    assert (home / "vectors" / "DocumentChunk_text" / "collection.json").is_file()
