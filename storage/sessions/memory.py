"""In-process twins of the session stores, for embedded use in one process and tests."""

from __future__ import annotations

import builtins
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from kenning.pipeline.models import utcnow
from kenning.pipeline.session import (
    DEFAULT_TTL_S,
    FeedbackEditing,
    SessionEntry,
    SessionKey,
    SessionRecord,
    cites_any,
)


@dataclass
class _Session:
    entries: list[SessionEntry] = field(default_factory=list)
    written_at: float = 0.0


class MemorySessionStore(FeedbackEditing):
    """SessionStore in a dict behind a lock; `clock` (seconds) decides expiry, so tests can move it."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._sessions: dict[SessionKey, _Session] = {}
        self._lock = threading.Lock()

    def append(self, key: SessionKey, entry: SessionEntry) -> None:
        with self._lock:
            session = self._live(key) or self._sessions.setdefault(key, _Session())
            session.entries.append(entry.model_copy(deep=True))
            session.written_at = self._clock()

    def get_session(self, key: SessionKey, last_n: int | None = None) -> list[SessionEntry]:
        with self._lock:
            session = self._live(key)
            entries = session.entries if session else []
            if last_n is not None:
                entries = entries[-last_n:] if last_n > 0 else []
            return [entry.model_copy(deep=True) for entry in entries]

    def forget_data(self, tenant: str, data_ids: Sequence[str], datasets: Sequence[str] = ()) -> int:
        wanted, whole = set(data_ids), set(datasets)
        removed = 0
        with self._lock:
            for key in [key for key in self._sessions if key.tenant == tenant]:
                session = self._live(key)
                if session is None:
                    continue
                kept = [entry for entry in session.entries if not cites_any(entry, wanted, whole)]
                removed += len(session.entries) - len(kept)
                session.entries = kept
        return removed

    def delete_session(self, key: SessionKey) -> None:
        with self._lock:
            self._sessions.pop(key, None)

    def list_sessions(self, tenant: str, user: str | None = None) -> list[SessionKey]:
        with self._lock:
            keys = [
                key
                for key in list(self._sessions)
                if key.tenant == tenant and user in (None, key.user) and self._live(key)
            ]
        return sorted(keys, key=lambda key: (key.user, key.session_id))

    def _update(self, key: SessionKey, entry_id: str, change: Callable[[SessionEntry], SessionEntry]) -> bool:
        with self._lock:
            session = self._live(key)
            if session is None:
                return False
            for position, entry in enumerate(session.entries):
                if entry.id == entry_id:
                    session.entries[position] = change(entry)
                    session.written_at = self._clock()
                    return True
            return False

    def _live(self, key: SessionKey) -> _Session | None:
        """The session unless it expired; an expired one is dropped. Call with the lock held."""
        session = self._sessions.get(key)
        if session is not None and self._ttl_s > 0 and self._clock() - session.written_at >= self._ttl_s:
            del self._sessions[key]
            return None
        return session


class MemorySessionRecords:
    """SessionRecords in a dict behind a lock; `clock` gives the activity times."""

    def __init__(self, clock: Callable[[], datetime] = utcnow) -> None:
        self._clock = clock
        self._records: dict[SessionKey, SessionRecord] = {}
        self._lock = threading.Lock()

    def touch(
        self,
        key: SessionKey,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
        model: str = "",
        error: str = "",
    ) -> SessionRecord:
        now = self._clock()
        with self._lock:
            record = self._records.get(key) or SessionRecord(key=key, started_at=now)
            record = record.used(now, tokens_in, tokens_out, cost, model, error)
            self._records[key] = record
            return record.model_copy(deep=True)

    def end(self, key: SessionKey) -> bool:
        now = self._clock()
        with self._lock:
            record = self._records.get(key)
            if record is None:
                return False
            ended_at = record.ended_at or now
            self._records[key] = record.model_copy(update={"status": "ended", "ended_at": ended_at})
            return True

    def get(self, key: SessionKey) -> SessionRecord | None:
        with self._lock:
            record = self._records.get(key)
            return record.model_copy(deep=True) if record else None

    def list(self, tenant: str, user: str | None = None) -> builtins.list[SessionRecord]:
        with self._lock:
            records = [
                record.model_copy(deep=True)
                for key, record in self._records.items()
                if key.tenant == tenant and user in (None, key.user)
            ]
        records.sort(key=lambda record: (record.key.user, record.key.session_id))
        return sorted(records, key=lambda record: record.last_activity_at, reverse=True)
