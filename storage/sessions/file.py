"""Agent sessions on the local disk, for embedded mode: one JSON-lines file per session."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

from pydantic import ValidationError

from kenning.pipeline.errors import InputError, StoreError
from kenning.pipeline.session import DEFAULT_TTL_S, FeedbackEditing, SessionEntry, SessionKey, cites_any

# Layout: <root>/<tenant>/<user>/<session id>.jsonl, each part encoded by `_part`, and one
# <root>/<tenant>/.lock that every access to the tenant's sessions locks with flock: shared to
# read one session, exclusive to write or to sweep. "." is always encoded, so no part can be
# ".", ".." or the lock file. A file's mtime is its last write, set from `clock`.
_KEPT = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_EMPTY = "%"
_MAX_NAME = 240
_SUFFIX = ".jsonl"


class FileSessionStore(FeedbackEditing):
    """SessionStore in files under `root`. A session expires `ttl_s` seconds after its last
    write (0: never), checked when it is read; expired files are removed by writes and sweeps.

    Writers of a tenant take turns under an exclusive file lock, so processes sharing the
    root never lose or tear an entry; an entry changed in place is written to a new file
    that replaces the old one at once.
    """

    def __init__(
        self, root: Path, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self._root = root
        self._ttl_s = ttl_s
        self._clock = clock

    def append(self, key: SessionKey, entry: SessionEntry) -> None:
        path = self._path(key)
        with self._locked(key.tenant, exclusive=True):
            if self._expired(path):
                path.unlink()
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab+") as file:
                line = entry.model_dump_json().encode() + b"\n"
                if file.tell() > 0:
                    # A line cut short by a crash must not swallow this entry.
                    file.seek(-1, os.SEEK_END)
                    line = line if file.read(1) == b"\n" else b"\n" + line
                file.write(line)
            self._stamp(path, self._clock())

    def get_session(self, key: SessionKey, last_n: int | None = None) -> list[SessionEntry]:
        path = self._path(key)
        if not path.exists():
            return []
        with self._locked(key.tenant, exclusive=False):
            entries = [] if self._expired(path) else _read(path)
        if last_n is not None:
            return entries[-last_n:] if last_n > 0 else []
        return entries

    def forget_data(self, tenant: str, data_ids: Sequence[str], datasets: Sequence[str] = ()) -> int:
        if not (self._root / _part(tenant)).exists():
            return 0
        wanted, whole = set(data_ids), set(datasets)
        removed = 0
        with self._locked(tenant, exclusive=True):
            for path in self._live_paths(tenant, None):
                entries = _read(path)
                kept = [entry for entry in entries if not cites_any(entry, wanted, whole)]
                if len(kept) < len(entries):
                    # The old mtime stays: forgetting data does not extend a session's life.
                    written_at = path.stat().st_mtime
                    _rewrite(path, kept)
                    self._stamp(path, written_at)
                    removed += len(entries) - len(kept)
        return removed

    def delete_session(self, key: SessionKey) -> None:
        path = self._path(key)
        if path.exists():
            with self._locked(key.tenant, exclusive=True):
                path.unlink(missing_ok=True)

    def list_sessions(self, tenant: str, user: str | None = None) -> list[SessionKey]:
        if not (self._root / _part(tenant)).exists():
            return []
        with self._locked(tenant, exclusive=True):
            paths = self._live_paths(tenant, user)
        keys = [
            SessionKey(
                tenant=tenant, user=_unpart(path.parent.name), session_id=_unpart(path.name[: -len(_SUFFIX)])
            )
            for path in paths
        ]
        return sorted(keys, key=lambda key: (key.user, key.session_id))

    def _update(self, key: SessionKey, entry_id: str, change: Callable[[SessionEntry], SessionEntry]) -> bool:
        path = self._path(key)
        if not path.exists():
            return False
        with self._locked(key.tenant, exclusive=True):
            if self._expired(path):
                path.unlink()
                return False
            entries = _read(path)
            for position, entry in enumerate(entries):
                if entry.id == entry_id:
                    entries[position] = change(entry)
                    _rewrite(path, entries)
                    self._stamp(path, self._clock())
                    return True
        return False

    def _live_paths(self, tenant: str, user: str | None) -> list[Path]:
        """The tenant's session files that have not expired; expired ones are removed. Hold the lock."""
        folder = self._root / _part(tenant)
        pattern = f"{_part(user) if user is not None else '*'}/*{_SUFFIX}"
        live = []
        for path in sorted(folder.glob(pattern)):
            if self._expired(path):
                path.unlink()
            else:
                live.append(path)
        return live

    def _expired(self, path: Path) -> bool:
        try:
            written_at = path.stat().st_mtime
        except FileNotFoundError:
            return False
        return self._ttl_s > 0 and self._clock() - written_at >= self._ttl_s

    def _stamp(self, path: Path, written_at: float) -> None:
        os.utime(path, (written_at, written_at))

    def _path(self, key: SessionKey) -> Path:
        return self._root / _part(key.tenant) / _part(key.user) / (_part(key.session_id) + _SUFFIX)

    @contextmanager
    def _locked(self, tenant: str, exclusive: bool) -> Iterator[None]:
        folder = self._root / _part(tenant)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"session store: cannot open {folder}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        except OSError as exc:
            raise StoreError(f"session store: {exc}") from exc
        finally:
            os.close(fd)


def _part(value: str) -> str:
    """A file name for one part of a key: lower-case letters, digits, "_" and "-" kept, every
    other byte of its UTF-8 as %XX, so that distinct parts give distinct names on any file system."""
    if not value:
        return _EMPTY
    name = "".join(
        char if char in _KEPT else "".join(f"%{byte:02X}" for byte in char.encode()) for char in value
    )
    if len(name) > _MAX_NAME:
        limit = f"at most {_MAX_NAME} encoded characters"
        raise InputError(f"session key part too long ({limit}): {value[:40]}...")
    return name


def _unpart(name: str) -> str:
    return "" if name == _EMPTY else unquote(name)


def _read(path: Path) -> list[SessionEntry]:
    entries: list[SessionEntry] = []
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return entries
    for line in lines:
        try:
            entries.append(SessionEntry.model_validate_json(line))
        except ValidationError:
            # A line cut short by a crash mid-append; the entries around it are whole.
            continue
    return entries


def _rewrite(path: Path, entries: list[SessionEntry]) -> None:
    """Replace the file's content at once: readers see the old file or the new one, never half."""
    staging = path.with_name(path.name + ".tmp")
    staging.write_bytes(b"".join(entry.model_dump_json().encode() + b"\n" for entry in entries))
    os.replace(staging, path)
