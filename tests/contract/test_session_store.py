"""One contract for the session stores: memory, files and Redis."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis

from kenning.pipeline.errors import TransientStoreError
from kenning.pipeline.session import SessionEntry, SessionKey, SessionStore
from kenning.storage.sessions.file import FileSessionStore
from kenning.storage.sessions.memory import MemorySessionStore
from kenning.storage.sessions.redis import RedisSessionStore
from tests.services import ROOT, free_port

BACKENDS = ["memory", "file", pytest.param("redis", marks=pytest.mark.redis)]
TTL_S = 60


@dataclass
class Clock:
    """A clock the test moves by hand."""

    now: float = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Backend:
    """A store under test, and a way to get past its TTL."""

    store: SessionStore
    expire: Callable[[SessionKey], None]
    clock: Clock | None


MakeBackend = Callable[[int], Backend]


@pytest.fixture(params=BACKENDS)
def make_backend(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> Iterator[MakeBackend]:
    """Stores over one shared state per test; the TTL given is used by memory and files, Redis gets 1 s."""
    clients: list[redis.Redis] = []

    def make(ttl_s: int) -> Backend:
        if request.param == "redis":
            client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
            clients.append(client)
            store = RedisSessionStore(client, key_prefix, ttl_s=1)
            return Backend(store, lambda key: wait_until_gone(store, key), None)
        clock = Clock()

        def move_past(_key: SessionKey) -> None:
            clock.now += ttl_s + 1

        twin: SessionStore
        if request.param == "memory":
            twin = MemorySessionStore(ttl_s=ttl_s, clock=clock)
        else:
            twin = FileSessionStore(tmp_path / "sessions", ttl_s=ttl_s, clock=clock)
        return Backend(twin, move_past, clock)

    yield make
    for client in clients[:1]:
        keys = list(client.scan_iter(match=key_prefix + "*", count=100))
        if keys:
            client.delete(*keys)
    for client in clients:
        client.close()


@pytest.fixture
def store(make_backend: MakeBackend) -> SessionStore:
    return make_backend(TTL_S).store


@pytest.fixture
def key() -> SessionKey:
    return SessionKey(tenant=f"tenant-{uuid.uuid4().hex[:8]}", user="ada", session_id="s1")


def wait_until_gone(store: SessionStore, key: SessionKey, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while store.get_session(key) and time.monotonic() < deadline:
        time.sleep(0.2)


def qa(question: str, answer: str = "", **fields: object) -> SessionEntry:
    return SessionEntry.model_validate({"question": question, "answer": answer, **fields})


def questions(entries: list[SessionEntry]) -> list[str]:
    return [entry.question for entry in entries]


def feedback(entries: list[SessionEntry]) -> list[tuple[str, int | None]]:
    return [(entry.feedback_text, entry.feedback_score) for entry in entries]


# Entries


def test_entries_come_back_oldest_first_and_last_n_gives_the_newest(
    store: SessionStore, key: SessionKey
) -> None:
    for n in range(5):
        store.append(key, qa(f"q{n}"))

    assert questions(store.get_session(key)) == ["q0", "q1", "q2", "q3", "q4"]
    assert questions(store.get_session(key, last_n=2)) == ["q3", "q4"]
    assert questions(store.get_session(key, last_n=50)) == ["q0", "q1", "q2", "q3", "q4"]
    assert store.get_session(key, last_n=0) == []


def test_an_unknown_session_is_empty(store: SessionStore, key: SessionKey) -> None:
    assert store.get_session(key) == []
    assert store.get_session(key, last_n=3) == []
    assert store.list_sessions(key.tenant) == []


def test_entries_round_trip_with_every_field(store: SessionStore, key: SessionKey) -> None:
    plus_two = timezone(timedelta(hours=2))
    entry = SessionEntry(
        time=datetime(2025, 3, 4, 5, 6, 7, 891011, tzinfo=plus_two),
        kind="message",
        question="Ada wrote the first program\nover two lines",
        context="ctx",
        answer="",
        speaker="Ada",
        said_at=datetime(2025, 3, 4, 5, 0, tzinfo=plus_two),
        feedback_text="good",
        feedback_score=4,
        element_ids=["node-1", "edge-2"],
        data_ids=["data-1"],
        dataset="docs",
    )

    store.append(key, entry)
    [stored] = store.get_session(key)

    assert stored == entry
    assert stored.time == datetime(2025, 3, 4, 3, 6, 7, 891011, tzinfo=UTC)
    assert stored.said_at is not None and stored.said_at.utcoffset() == timedelta(hours=2)


# Feedback


def test_feedback_is_added_and_deleted(store: SessionStore, key: SessionKey) -> None:
    first, second = qa("q0"), qa("q1")
    store.append(key, first)
    store.append(key, second)

    assert store.add_feedback(key, second.id, "spot on", 5) is True
    assert feedback(store.get_session(key)) == [("", None), ("spot on", 5)]

    assert store.delete_feedback(key, second.id) is True
    assert feedback(store.get_session(key)) == [("", None), ("", None)]
    assert questions(store.get_session(key)) == ["q0", "q1"]


def test_feedback_on_an_unknown_entry_or_session_is_false(store: SessionStore, key: SessionKey) -> None:
    store.append(key, qa("q0"))
    other = key.model_copy(update={"session_id": "nowhere"})

    assert store.add_feedback(key, "missing", "text", 3) is False
    assert store.delete_feedback(key, "missing") is False
    assert store.add_feedback(other, "missing", "text", 3) is False
    assert store.delete_feedback(other, "missing") is False
    assert store.list_sessions(key.tenant) == [key]


@pytest.mark.parametrize("score", [0, 6, -1])
def test_a_score_outside_one_to_five_is_refused_and_nothing_changes(
    store: SessionStore, key: SessionKey, score: int
) -> None:
    entry = qa("q0")
    store.append(key, entry)

    with pytest.raises(ValueError, match="1..5"):
        store.add_feedback(key, entry.id, "bad", score)

    assert store.get_session(key) == [entry]
    assert store.add_feedback(key, entry.id, "text only", None) is True
    assert store.get_session(key)[0].feedback_text == "text only"


# Forgetting data


def test_forget_data_removes_citing_entries_from_every_session_of_the_tenant_only(
    store: SessionStore, key: SessionKey
) -> None:
    # Given sessions of two users of a tenant, and a session of another tenant, citing the same data
    grace = key.model_copy(update={"user": "grace", "session_id": "s9"})
    stranger = key.model_copy(update={"tenant": key.tenant + "-other"})
    for session in (key, grace, stranger):
        store.append(session, qa("cites a", data_ids=["a"]))
        store.append(session, qa("cites b and c", data_ids=["b", "c"]))
        store.append(session, qa("cites nothing"))
    store.append(key, qa("cites d", data_ids=["d"]))

    # When a and c are forgotten in the tenant
    removed = store.forget_data(key.tenant, ["a", "c"])

    # Then every entry citing either is gone from its sessions, and the other tenant keeps its own
    assert removed == 4
    assert questions(store.get_session(key)) == ["cites nothing", "cites d"]
    assert questions(store.get_session(grace)) == ["cites nothing"]
    assert len(store.get_session(stranger)) == 3
    assert store.forget_data(key.tenant, ["a", "c"]) == 0
    assert store.forget_data(key.tenant + "-nobody", ["a"]) == 0


def test_forget_data_of_a_whole_dataset_removes_every_entry_built_from_it(
    store: SessionStore, key: SessionKey
) -> None:
    # Given a message of dataset chat citing no item, an answer that read chat and notes, and others
    store.append(key, SessionEntry(kind="message", question="a message", datasets=["chat"]))
    store.append(key, qa("read both", datasets=["chat", "notes"]))
    store.append(key, qa("read notes", datasets=["notes"]))
    store.append(key, SessionEntry(kind="message", question="older", dataset="chat"))

    # When chat is forgotten whole
    removed = store.forget_data(key.tenant, [], ["chat"])

    # Then every entry built from chat is gone, citing an item or not, and the rest stays
    assert removed == 3
    assert questions(store.get_session(key)) == ["read notes"]


# Isolation and listing


def test_one_session_id_under_two_users_or_tenants_is_two_sessions(
    store: SessionStore, key: SessionKey
) -> None:
    other_user = key.model_copy(update={"user": "grace"})
    other_tenant = key.model_copy(update={"tenant": key.tenant + "-other"})
    store.append(key, qa("mine"))
    store.append(other_user, qa("grace's"))
    store.append(other_tenant, qa("theirs"))

    assert questions(store.get_session(key)) == ["mine"]
    assert questions(store.get_session(other_user)) == ["grace's"]
    assert questions(store.get_session(other_tenant)) == ["theirs"]
    assert store.list_sessions(key.tenant) == [key, other_user]
    assert store.list_sessions(other_tenant.tenant) == [other_tenant]


def test_list_sessions_by_user_and_delete_session(store: SessionStore, key: SessionKey) -> None:
    pairs = [("bob", "z"), ("ada", "b"), ("ada", "a")]
    sessions = [key.model_copy(update={"user": user, "session_id": sid}) for user, sid in pairs]
    for session in sessions:
        store.append(session, qa("hello"))

    assert store.list_sessions(key.tenant, user="ada") == [sessions[2], sessions[1]]
    assert store.list_sessions(key.tenant) == [sessions[2], sessions[1], sessions[0]]

    store.delete_session(sessions[1])
    store.delete_session(sessions[1])

    assert store.get_session(sessions[1]) == []
    assert store.list_sessions(key.tenant) == [sessions[2], sessions[0]]
    assert store.list_sessions(key.tenant, user="nobody") == []


def test_keys_with_any_characters_stay_apart_and_list_back_as_given(
    store: SessionStore, key: SessionKey
) -> None:
    odd = ["", ".", "..", "a/b", "a:b", "A", "a", "%41", "ü ß", "x" * 60]
    sessions = [SessionKey(tenant=key.tenant + ":/..", user=user, session_id=user[::-1]) for user in odd]
    for n, session in enumerate(sessions):
        store.append(session, qa(f"q{n}"))

    for n, session in enumerate(sessions):
        assert questions(store.get_session(session)) == [f"q{n}"]
    assert store.list_sessions(key.tenant + ":/..") == sorted(sessions, key=lambda k: (k.user, k.session_id))
    assert store.list_sessions(key.tenant) == []


# Expiry


def test_a_session_expires_after_its_ttl_without_writes(make_backend: MakeBackend, key: SessionKey) -> None:
    # Given a session with an entry, and another session written to the store
    backend = make_backend(TTL_S)
    backend.store.append(key, qa("old", data_ids=["a"]))

    # When its TTL passes with no write
    backend.expire(key)

    # Then it is gone everywhere, and writing to it again starts a new session
    assert backend.store.get_session(key) == []
    assert backend.store.list_sessions(key.tenant) == []
    assert backend.store.forget_data(key.tenant, ["a"]) == 0
    backend.store.append(key, qa("new"))
    assert questions(backend.store.get_session(key)) == ["new"]
    assert backend.store.list_sessions(key.tenant) == [key]


@pytest.mark.parametrize("write", ["append", "feedback"])
def test_every_write_restarts_the_ttl_and_forgetting_does_not(
    make_backend: MakeBackend, key: SessionKey, write: str
) -> None:
    backend = make_backend(TTL_S)
    if backend.clock is None:
        pytest.skip("needs a clock the test can move")
    clock = backend.clock
    entry = qa("first", data_ids=["a"])
    backend.store.append(key, entry)
    backend.store.append(key, qa("second"))

    # When a write comes before the TTL passes, the session lives a whole TTL from that write
    clock.now += TTL_S * 0.6
    if write == "append":
        backend.store.append(key, qa("third"))
    else:
        assert backend.store.add_feedback(key, entry.id, "ok", 3)
    clock.now += TTL_S * 0.6
    assert backend.store.get_session(key) != []

    # But forgetting data is not a write of the session's: its TTL still runs from the last write
    clock.now += TTL_S * 0.3
    assert backend.store.forget_data(key.tenant, ["a"]) == 1
    clock.now += TTL_S * 0.2
    assert backend.store.get_session(key) == []


# Concurrency

WRITER = """
import sys, time
from pathlib import Path
from kenning.pipeline.session import SessionEntry, SessionKey
backend, where, prefix, worker, count, start = sys.argv[1:7]
if backend == "redis":
    import redis
    from kenning.storage.sessions.redis import RedisSessionStore
    store = RedisSessionStore(redis.Redis.from_url(where), prefix)
else:
    from kenning.storage.sessions.file import FileSessionStore
    store = FileSessionStore(Path(where))
key = SessionKey(tenant="t", user="u", session_id="shared")
time.sleep(max(0.0, float(start) - time.time()))
for n in range(int(count)):
    if worker == "feedback":
        assert store.add_feedback(key, "first", f"note {n}", n % 5 + 1)
    else:
        store.append(key, SessionEntry(id=f"{worker}-{n}", question=f"{worker} {n}"))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", pytest.param("redis", marks=pytest.mark.redis)])
def test_processes_writing_one_session_lose_no_entry(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str
) -> None:
    # Given a session with one entry, in Redis or in files shared by processes
    where = request.getfixturevalue("redis_url") if backend == "redis" else str(tmp_path / "sessions")
    store: SessionStore
    if backend == "redis":
        client = redis.Redis.from_url(where)
        request.addfinalizer(client.close)
        request.addfinalizer(lambda: [client.delete(k) for k in client.scan_iter(match=key_prefix + "*")])
        store = RedisSessionStore(client, key_prefix)
    else:
        store = FileSessionStore(Path(where))
    key = SessionKey(tenant="t", user="u", session_id="shared")
    store.append(key, SessionEntry(id="first", question="first"))

    # When two processes append to it, while a third keeps changing the feedback of its first entry
    count, start = 150, time.time() + 2.0
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, backend, where, key_prefix, worker, str(count), str(start)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for worker in ("one", "two", "feedback")
    ]
    outputs = [worker.communicate(timeout=120)[0] for worker in workers]

    # Then every entry is there once, each process's in its own order
    assert [worker.returncode for worker in workers] == [0, 0, 0], outputs
    entries = store.get_session(key)
    ids = [entry.id for entry in entries]
    assert len(ids) == 1 + 2 * count
    assert set(ids) == {"first"} | {f"{w}-{n}" for w in ("one", "two") for n in range(count)}
    for worker in ("one", "two"):
        assert [i for i in ids if i.startswith(worker)] == [f"{worker}-{n}" for n in range(count)]
    assert entries[0].feedback_text == f"note {count - 1}"


# Errors


@pytest.mark.redis
def test_an_unreachable_redis_is_a_transient_store_error(key: SessionKey) -> None:
    client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)
    store = RedisSessionStore(client, "kenning-test:")

    with pytest.raises(TransientStoreError):
        store.append(key, qa("q"))
    with pytest.raises(TransientStoreError):
        store.get_session(key)
    with pytest.raises(TransientStoreError):
        store.list_sessions(key.tenant)


def test_a_session_id_too_long_for_a_file_name_is_an_input_error(tmp_path: Path) -> None:
    from kenning.pipeline.errors import InputError
    from kenning.storage.sessions.file import FileSessionStore

    store = FileSessionStore(tmp_path)
    with pytest.raises(InputError, match="too long"):
        store.append(SessionKey(tenant="t", user="u", session_id="x" * 1000), SessionEntry(question="q"))
