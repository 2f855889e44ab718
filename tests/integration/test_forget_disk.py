"""Forget means gone from the disk and the servers too: after a forget, no file of the home (every
byte: SQLite pages and WAL, vector segments and WAL, blobs, sessions), no key of the FalkorDB
server (query telemetry included) and no session key in Redis holds the forgotten words; and the
home is private to its owner."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from kenning.pipeline.ingest import text_source
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.falkordb_server import MODULE_ARGS, falkordb_server

OTHER = "Falcon Dynamics is based in Boston. Nora Blake leads the research team."


@pytest.fixture(scope="module")
def telemetry_falkordb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A FalkorDB server that keeps query telemetry (CMD_INFO on, its own default)."""
    keeping = {name: value for name, value in MODULE_ARGS.items() if name != "CMD_INFO"}
    with falkordb_server(tmp_path_factory.mktemp("falkordb-telemetry"), keeping) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres+falkordb+redis", marks=pytest.mark.redis)])
def stores(request: pytest.FixtureRequest) -> dict[str, str]:
    """Embedded stores, or PostgreSQL (shared by the tests: a tenant of this test's own),
    FalkorDB and Redis sessions."""
    if request.param == "sqlite":
        return {}
    return {
        "tenant": f"disk{uuid.uuid4().hex[:8]}",
        "metadata_url": request.getfixturevalue("postgres_url"),
        "graph_backend": "falkordb",
        "graph_url": request.getfixturevalue("telemetry_falkordb"),
        "graph_name": f"kenning_disk_{uuid.uuid4().hex[:8]}",
        "session_backend": "redis",
        "redis_url": request.getfixturevalue("redis_url"),
        "queue_prefix": f"kenning-disk-{uuid.uuid4().hex[:8]}",
    }


def open_memory(home: Path, stores: dict[str, str]) -> Kenning:
    settings = {"embedding_provider": "hash", "blob_grace_s": "0", **stores}
    return Kenning(load_settings(home=home, **settings))


def secret_text() -> tuple[str, str]:
    secret = f"qzx{uuid.uuid4().hex}"
    return secret, f"Oliver Reed keeps the code {secret} in the vault of Falcon Dynamics in Boston."


def ingest(kenning: Kenning, texts: dict[str, str], dataset: str = "news") -> dict[str, str]:
    ids = {}
    for key, text in texts.items():
        ids[key] = kenning.add([text_source(text, name=key, external_id=key)], dataset).added[0].id
    assert kenning.cognify(dataset).status.value == "completed"
    return ids


def files_holding(home: Path, secret: str) -> list[str]:
    """Every file under the home whose bytes contain the secret."""
    needle = secret.encode()
    return [str(path) for path in home.rglob("*") if path.is_file() and needle in path.read_bytes()]


def server_keys_holding(stores: dict[str, str], secret: str) -> list[str]:
    """Every key of the FalkorDB server, and every key of this test's prefix in Redis, whose
    value holds the secret."""
    found = []
    if "graph_url" in stores:
        found += _keys_holding(stores["graph_url"], "*", secret)
    if "redis_url" in stores:
        found += _keys_holding(stores["redis_url"], f"*{stores['queue_prefix']}*", secret)
    return found


def _keys_holding(url: str, pattern: str, secret: str) -> list[str]:
    client = redis.Redis.from_url(url)
    try:
        return [
            key.decode()
            for key in client.scan_iter(match=pattern, count=1000)
            if secret.encode() in _value(client, key)
        ]
    finally:
        client.close()


def _value(client: redis.Redis, key: bytes) -> bytes:
    kind = client.type(key).decode()
    reads: dict[str, Any] = {
        "string": lambda: client.get(key),
        "hash": lambda: client.hgetall(key),
        "list": lambda: client.lrange(key, 0, -1),
        "set": lambda: client.smembers(key),
        "zset": lambda: client.zrange(key, 0, -1),
        "stream": lambda: client.xrange(key),
        "graphdata": lambda: client.dump(key),
    }
    return repr(reads.get(kind, lambda: client.dump(key))()).encode()


def everywhere(home: Path, stores: dict[str, str], secret: str) -> list[str]:
    return files_holding(home, secret) + server_keys_holding(stores, secret)


def test_forgetting_an_item_leaves_its_words_nowhere(tmp_path: Path, stores: dict[str, str]) -> None:
    # Given an item with a secret beside another item, both cognified
    secret, text = secret_text()
    with open_memory(tmp_path / "home", stores) as kenning:
        ids = ingest(kenning, {"secret": text, "other": OTHER})
        assert everywhere(tmp_path / "home", stores, secret), "the secret was stored somewhere"
        # When the secret's item is forgotten
        done = kenning.forget("news", [ids["secret"]])[0]
        # Then no file of the home and no server key holds it, and the forget says what it wiped
        assert everywhere(tmp_path / "home", stores, secret) == []
        assert done.erased.get("vector_collections", 0) > 0
        assert done.erased.get("blobs", 0) >= 0
        assert kenning.wiring.metadata.get_items([ids["other"]])


def test_forgetting_a_dataset_leaves_its_words_nowhere(tmp_path: Path, stores: dict[str, str]) -> None:
    secret, text = secret_text()
    with open_memory(tmp_path / "home", stores) as kenning:
        ingest(kenning, {"secret": text, "other": OTHER})
        ingest(kenning, {"kept": OTHER.replace("Nora", "Anna")}, "kept")
        kenning.forget("news")
        assert everywhere(tmp_path / "home", stores, secret) == []


def test_forgetting_everything_leaves_its_words_nowhere(tmp_path: Path, stores: dict[str, str]) -> None:
    secret, text = secret_text()
    with open_memory(tmp_path / "home", stores) as kenning:
        ingest(kenning, {"secret": text})
        ingest(kenning, {"more": f"Anna Reed read {secret} aloud."}, "second")
        kenning.forget(None, everything=True)
        assert everywhere(tmp_path / "home", stores, secret) == []


def test_bytes_kept_by_a_memory_only_forget_go_with_the_dataset(tmp_path: Path) -> None:
    # Given an item forgotten from memory only: its bytes stay, nothing refers to them
    secret, text = secret_text()
    home = tmp_path / "home"
    with open_memory(home, {}) as kenning:
        ids = ingest(kenning, {"secret": text, "other": OTHER})
        kenning.forget("news", [ids["secret"]], memory_only=True)
        assert any("blobs" in path for path in files_holding(home, secret))
        # When the dataset is forgotten
        done = kenning.forget("news")[0]
        # Then the bytes no item refers to are gone as well
        assert files_holding(home, secret) == []
        assert done.erased["blobs"] >= 1


def test_no_empty_lexical_row_stays_for_a_forgotten_dataset(tmp_path: Path) -> None:
    with open_memory(tmp_path / "home", {}) as kenning:
        ingest(kenning, {"other": OTHER})
        kenning.forget("news")
        with kenning.wiring.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT tenant, dataset FROM lexical_stats").all()
        assert rows == []


def test_the_home_is_private_under_a_permissive_umask(tmp_path: Path) -> None:
    # Given the usual umask 022
    previous = os.umask(0o022)
    try:
        home = tmp_path / "home"
        with open_memory(home, {}) as kenning:
            # When a memory is written (metadata, vectors, blobs, sessions, locks)
            ingest(kenning, {"other": OTHER})
            kenning.remember("Nora Blake moved to Denver.", "news", session_id="s1")
        # Then nobody but the owner may read or enter any of it
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        loose = [
            f"{path} {stat.S_IMODE(path.stat().st_mode):o}"
            for path in home.rglob("*")
            if stat.S_IMODE(path.stat().st_mode) & 0o077
        ]
        assert loose == []
        assert (home / "kenning.db").exists()
    finally:
        os.umask(previous)
