"""One contract for the blob stores: files on disk and the in-memory twin."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import content_hash
from kenning.pipeline.ports import BlobStore
from kenning.storage.sources.blob import FileBlobStore, MemoryBlobStore


@pytest.fixture(params=["memory", "file"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "memory":
        return MemoryBlobStore()
    return FileBlobStore(tmp_path / "blobs")


def test_put_then_get_returns_the_same_bytes(blobs: BlobStore) -> None:
    data = bytes(range(256)) * 1000
    key = content_hash(data)

    blobs.put(key, data)

    assert blobs.exists(key)
    assert blobs.get(key) == data


def test_empty_blob_round_trips(blobs: BlobStore) -> None:
    key = content_hash(b"")
    blobs.put(key, b"")

    assert blobs.exists(key)
    assert blobs.get(key) == b""


def test_missing_blob_does_not_exist_and_get_raises(blobs: BlobStore) -> None:
    key = content_hash(b"never stored")

    assert not blobs.exists(key)
    with pytest.raises(StoreError, match="no blob"):
        blobs.get(key)


def test_put_again_replaces_the_blob(blobs: BlobStore) -> None:
    key = content_hash(b"first")
    blobs.put(key, b"first")

    blobs.put(key, b"second")

    assert blobs.get(key) == b"second"


@pytest.mark.parametrize("key", ["../../etc/passwd", "ab/cd", "", "ab", "ABCDEF", "sha256:abcd"])
def test_keys_other_than_content_hashes_are_refused(blobs: BlobStore, key: str) -> None:
    with pytest.raises(StoreError, match="invalid key"):
        blobs.put(key, b"x")
    with pytest.raises(StoreError, match="invalid key"):
        blobs.get(key)


def test_readers_see_whole_blobs_while_a_writer_replaces_one(blobs: BlobStore) -> None:
    # Given two large versions of one blob, written in turn while another thread reads
    versions = (b"a" * 2_000_000, b"b" * 3_000_000)
    key = content_hash(b"contended")
    blobs.put(key, versions[0])
    done = threading.Event()
    seen: list[bytes] = []

    def read() -> None:
        for _ in range(200):
            if done.is_set():
                return
            seen.append(blobs.get(key))

    reader = threading.Thread(target=read)
    reader.start()
    for round_ in range(40):
        blobs.put(key, versions[round_ % 2])
    done.set()
    reader.join(timeout=60)

    # Then every read returned one complete version, never a mix or a prefix
    assert not reader.is_alive()
    assert seen
    assert all(data in versions for data in seen)


def test_file_store_fans_out_by_key_prefix_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    root = tmp_path / "blobs"
    store = FileBlobStore(root)
    data = b"hello"
    key = content_hash(data)

    store.put(key, data)
    store.put(key, data)

    assert (root / key[:2] / key[2:]).read_bytes() == data
    assert [path.relative_to(root) for path in root.rglob("*") if path.is_file()] == [Path(key[:2], key[2:])]


def test_file_store_reads_what_another_instance_wrote(tmp_path: Path) -> None:
    data = b"shared across processes"
    key = content_hash(data)
    FileBlobStore(tmp_path).put(key, data)

    assert FileBlobStore(tmp_path).get(key) == data


def test_file_store_write_failure_is_a_store_error(tmp_path: Path) -> None:
    # Given a root that is a file, not a folder
    root = tmp_path / "not-a-folder"
    root.write_bytes(b"")

    with pytest.raises(StoreError, match="cannot write"):
        FileBlobStore(root).put(content_hash(b"x"), b"x")


def test_keys_lists_every_blob_written_long_enough_ago(blobs: BlobStore) -> None:
    # Given two blobs, one of them deleted again
    kept, gone = b"kept bytes", b"gone bytes"
    blobs.put(content_hash(kept), kept)
    blobs.put(content_hash(gone), gone)
    blobs.delete(content_hash(gone))
    # Then keys lists the one left, but not among those written within the last hour
    assert list(blobs.keys()) == [content_hash(kept)]
    assert list(blobs.keys(older_than_s=3600)) == []


def test_file_blobs_are_private_by_default(tmp_path: Path) -> None:
    # Given the umask most systems start with
    previous = os.umask(0o022)
    try:
        store = FileBlobStore(tmp_path / "blobs")
        store.put(content_hash(b"private"), b"private")
        shared = FileBlobStore(tmp_path / "shared", mode=0o644)
        shared.put(content_hash(b"shared"), b"shared")
    finally:
        os.umask(previous)
    assert mode_of(tmp_path / "blobs", b"private") == 0o600
    assert mode_of(tmp_path / "shared", b"shared") == 0o644


def mode_of(root: Path, data: bytes) -> int:
    key = content_hash(data)
    return stat.S_IMODE((root / key[:2] / key[2:]).stat().st_mode)
