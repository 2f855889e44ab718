"""Agent sessions in Redis, shared by every worker process."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar
from urllib.parse import quote, unquote

import redis
from redis.client import Pipeline

from kenning.pipeline.errors import StoreError, TransientStoreError
from kenning.pipeline.session import DEFAULT_TTL_S, FeedbackEditing, SessionEntry, SessionKey, cites_any

T = TypeVar("T")

# Keys: <prefix>session:<tenant>:<user>:<session id> is a list of JSON entries, oldest first;
# <prefix>sessions:<tenant> is the set of "<user>:<session id>" of the tenant's sessions, so
# that forget_data finds them all. Each part is percent-encoded, so ":" cannot be confused.
# A session's member leaves the set only when its list is gone, checked and removed in one
# step, so an append racing the cleanup keeps its member.
_PRUNE = """
if redis.call('exists', KEYS[2]) == 0 then return redis.call('srem', KEYS[1], ARGV[1]) end
return 0
"""


class RedisSessionStore(FeedbackEditing):
    """SessionStore in Redis. Every write to a session refreshes its TTL (seconds; 0: no expiry).

    Appends are single atomic commands, so concurrent writers never lose an entry; changes to
    existing entries run in WATCH/MULTI transactions and retry when the list moved underneath.
    """

    def __init__(self, client: redis.Redis, prefix: str, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_s = ttl_s
        self._prune = client.register_script(_PRUNE)

    def append(self, key: SessionKey, entry: SessionEntry) -> None:
        with _translated():
            pipe = self._client.pipeline()
            pipe.rpush(self._session(key), entry.model_dump_json())
            pipe.sadd(self._index(key.tenant), _member(key))
            self._refresh(pipe, key)
            pipe.execute()

    def get_session(self, key: SessionKey, last_n: int | None = None) -> list[SessionEntry]:
        if last_n is not None and last_n <= 0:
            return []
        with _translated():
            raws = self._client.lrange(self._session(key), -last_n if last_n else 0, -1)
        return [SessionEntry.model_validate_json(raw) for raw in raws]

    def forget_data(self, tenant: str, data_ids: Sequence[str], datasets: Sequence[str] = ()) -> int:
        wanted, whole = set(data_ids), set(datasets)
        return sum(self._forget(key, wanted, whole) for key in self._keys(tenant))

    def delete_session(self, key: SessionKey) -> None:
        with _translated():
            pipe = self._client.pipeline()
            pipe.delete(self._session(key))
            pipe.srem(self._index(key.tenant), _member(key))
            pipe.execute()

    def list_sessions(self, tenant: str, user: str | None = None) -> list[SessionKey]:
        keys = [key for key in self._keys(tenant) if user in (None, key.user)]
        return sorted(keys, key=lambda key: (key.user, key.session_id))

    def _update(self, key: SessionKey, entry_id: str, change: Callable[[SessionEntry], SessionEntry]) -> bool:
        name = self._session(key)

        def attempt(pipe: Pipeline) -> bool:
            for position, raw in enumerate(pipe.lrange(name, 0, -1)):
                entry = SessionEntry.model_validate_json(raw)
                if entry.id == entry_id:
                    pipe.multi()
                    pipe.lset(name, position, change(entry).model_dump_json())
                    self._refresh(pipe, key)
                    return True
            return False

        return self._watched(name, attempt)

    def _forget(self, key: SessionKey, wanted: set[str], whole: set[str]) -> int:
        name = self._session(key)

        def attempt(pipe: Pipeline) -> int:
            raws = [_text(raw) for raw in pipe.lrange(name, 0, -1)]
            entries = [SessionEntry.model_validate_json(raw) for raw in raws]
            doomed = [
                raw for raw, entry in zip(raws, entries, strict=True) if cites_any(entry, wanted, whole)
            ]
            pipe.multi()
            # LREM leaves the TTL alone: forgetting data does not extend a session's life.
            for raw in doomed:
                pipe.lrem(name, 1, raw)
            return len(doomed)

        return self._watched(name, attempt)

    def _watched(self, name: str, attempt: Callable[[Pipeline], T]) -> T:
        """Run `attempt` with `name` watched, again until no other client changed it meanwhile."""
        with _translated(), self._client.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(name)  # type: ignore[no-untyped-call]
                    result = attempt(pipe)
                    pipe.execute()
                    return result
                except redis.WatchError:
                    continue

    def _keys(self, tenant: str) -> list[SessionKey]:
        """The tenant's live sessions; members of expired ones are removed from the index."""
        index = self._index(tenant)
        with _translated():
            members = [_text(member) for member in self._client.smembers(index)]
            keys = [_key(tenant, member) for member in members]
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.exists(self._session(key))
            live = pipe.execute()
            for key, member, exists in zip(keys, members, live, strict=True):
                if not exists:
                    self._prune(keys=[index, self._session(key)], args=[member])
        return [key for key, exists in zip(keys, live, strict=True) if exists]

    def _refresh(self, pipe: Pipeline, key: SessionKey) -> None:
        # The index lives as long as the newest write of any of its sessions, so never shorter than one.
        if self._ttl_s > 0:
            pipe.expire(self._session(key), self._ttl_s)
            pipe.expire(self._index(key.tenant), self._ttl_s)

    def _session(self, key: SessionKey) -> str:
        return f"{self._prefix}session:{_part(key.tenant)}:{_member(key)}"

    def _index(self, tenant: str) -> str:
        return f"{self._prefix}sessions:{_part(tenant)}"


def _part(value: str) -> str:
    return quote(value, safe="")


def _member(key: SessionKey) -> str:
    return f"{_part(key.user)}:{_part(key.session_id)}"


def _key(tenant: str, member: str) -> SessionKey:
    user, session_id = member.split(":")
    return SessionKey(tenant=tenant, user=unquote(user), session_id=unquote(session_id))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise TransientStoreError(f"session store unavailable: {exc}") from exc
    except redis.RedisError as exc:
        raise StoreError(f"session store error: {exc}") from exc
