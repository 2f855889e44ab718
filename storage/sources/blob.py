"""Raw bytes of data items by content hash: on a local disk, or in memory."""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kenning.pipeline.errors import StoreError

# Keys are content hashes; anything else could escape the root or collide on a case-folding disk.
KEY = re.compile(r"[0-9a-f]{3,128}")


def check_key(key: str) -> str:
    if not KEY.fullmatch(key):
        raise StoreError(f"blob store: invalid key {key!r}, expected a lowercase hex content hash")
    return key


class FileBlobStore:
    """Blobs as files under `root`, fanned out as root/ab/cdef...

    Writes go to a temporary file that is then renamed into place, so a reader sees
    either no blob or the whole blob, never part of one. Files get `mode` (private by default).
    """

    def __init__(self, root: Path, mode: int = 0o600) -> None:
        self._root = root
        self._mode = mode

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write_replacing(path, data)
        except OSError as exc:
            raise StoreError(f"blob store: cannot write {key}: {exc}") from exc

    def get(self, key: str) -> bytes:
        """The blob's bytes; StoreError when there is no blob of that key."""
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise StoreError(f"blob store: no blob {key}") from exc
        except OSError as exc:
            raise StoreError(f"blob store: cannot read {key}: {exc}") from exc

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"blob store: cannot delete {key}: {exc}") from exc

    def keys(self, older_than_s: float = 0.0) -> Iterator[str]:
        """The key of every blob last written more than `older_than_s` seconds ago."""
        if not self._root.is_dir():
            return
        newest = time.time() - older_than_s
        for path in self._root.glob("??/*"):
            key = path.parent.name + path.name
            if KEY.fullmatch(key) and _written_before(path, newest):
                yield key

    def _path(self, key: str) -> Path:
        check_key(key)
        return self._root / key[:2] / key[2:]

    def _write_replacing(self, path: Path, data: bytes) -> None:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            os.fchmod(handle, self._mode)
            with os.fdopen(handle, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def _written_before(path: Path, moment: float) -> bool:
    try:
        return path.stat().st_mtime <= moment
    except FileNotFoundError:  # deleted meanwhile
        return False


class MemoryBlobStore:
    """Blobs in a dictionary, safe across threads; the twin of FileBlobStore."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blobs: dict[str, bytes] = {}
        self._written: dict[str, float] = {}

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        with self._lock:
            self._blobs[key] = bytes(data)
            self._written[key] = time.time()

    def get(self, key: str) -> bytes:
        """The blob's bytes; StoreError when there is no blob of that key."""
        check_key(key)
        with self._lock:
            try:
                return self._blobs[key]
            except KeyError:
                raise StoreError(f"blob store: no blob {key}") from None

    def exists(self, key: str) -> bool:
        check_key(key)
        with self._lock:
            return key in self._blobs

    def delete(self, key: str) -> None:
        check_key(key)
        with self._lock:
            self._blobs.pop(key, None)
            self._written.pop(key, None)

    def keys(self, older_than_s: float = 0.0) -> Iterator[str]:
        """The key of every blob last written more than `older_than_s` seconds ago."""
        newest = time.time() - older_than_s
        with self._lock:
            found = [key for key, written in self._written.items() if written <= newest]
        yield from found
