"""Raw bytes of data items by content hash: on a local disk, or in memory."""

from __future__ import annotations

import os
import re
import tempfile
import threading
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
    either no blob or the whole blob, never part of one.
    """

    def __init__(self, root: Path) -> None:
        self._root = root

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

    def _path(self, key: str) -> Path:
        check_key(key)
        return self._root / key[:2] / key[2:]

    @staticmethod
    def _write_replacing(path: Path, data: bytes) -> None:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            # mkstemp creates the file private to its owner; blobs are ordinary readable data.
            os.fchmod(handle, 0o644)
            with os.fdopen(handle, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


class MemoryBlobStore:
    """Blobs in a dictionary, safe across threads; the twin of FileBlobStore."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blobs: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        with self._lock:
            self._blobs[key] = bytes(data)

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
