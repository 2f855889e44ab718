"""The turn cache: payloads kept by stamp, read again when a turn is written, dropped when forgotten."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

from kenning.pipeline.models import Scope, ScoredPoint, VectorPoint, stable_id
from kenning.retrieval.conversation import Turn, context_text, mend_turns, turn_points, turns_of
from kenning.retrieval.turn_cache import STAMP, TURN_FIELDS, TURNS, TurnCache, turn_cache
from kenning.storage.inference.embedder import HashEmbedder
from kenning.storage.vectors.memory import MemoryVectorStore

SAID = "[2023-05-08T13:56:00] "
CHAT = ["Ada: Hi Ben", "Ben: I played the saxophone yesterday", "Ada: Since when?", "Ben: Last spring"]
SCOPE = Scope(tenant="t", dataset="chat")


class Counted(MemoryVectorStore):
    """The twin, noting the payload fields each search asked for and the ids each retrieve read."""

    def __init__(self) -> None:
        super().__init__()
        self.searched: list[tuple[str, ...]] = []
        self.retrieved: list[list[str]] = []

    def search(
        self,
        scope: Scope,
        collection: str,
        vector: Sequence[float],
        limit: int,
        fields: Sequence[str] | None = None,
    ) -> list[ScoredPoint]:
        self.searched.append(tuple(fields or ()))
        return super().search(scope, collection, vector, limit, fields)

    def retrieve(
        self, scope: Scope, collection: str, ids: Sequence[str], fields: Sequence[str] | None = None
    ) -> list[VectorPoint]:
        self.retrieved.append(list(ids))
        return super().retrieve(scope, collection, ids, fields)


def remembered(*scopes: Scope) -> tuple[Counted, HashEmbedder, list[str]]:
    """The chat's turns in a store, in SCOPE (and any other scopes given)."""
    store, embedder = Counted(), HashEmbedder(32)
    ids = [stable_id("turn", str(n)) for n in range(len(CHAT))]
    said = [
        Turn(
            f"item-{n}", ids[n], "doc", SAID + text, CHAT[n - 1] if n else "", text, "", "2023-05-08T13:56:00"
        )
        for n, text in enumerate(CHAT)
    ]
    store.ensure_collection(TURNS, embedder.dimension)
    vectors = embedder.embed([context_text(t.context, t.text) for t in said])
    for scope in (SCOPE, *scopes):
        store.upsert(scope, TURNS, turn_points(said, vectors))
    return store, embedder, ids


def as_read(points: Sequence[ScoredPoint]) -> list[tuple[str, float, dict[str, Any]]]:
    return [(p.id, p.score, {k: p.payload.get(k) for k in TURN_FIELDS}) for p in points]


def full_read(store: MemoryVectorStore, vector: Sequence[float]) -> list[tuple[str, float, dict[str, Any]]]:
    return as_read(store.search(SCOPE, TURNS, vector, 100, TURN_FIELDS))


def test_a_second_read_takes_the_payloads_it_has_seen_by_their_stamps() -> None:
    # Given a conversation's turns, read once
    store, embedder, ids = remembered()
    cache, vector = TurnCache(), embedder.embed(["saxophone"])[0]
    first, _ = cache.read(store, SCOPE, vector, 100)

    # When they are read again
    store.searched.clear()
    again, known = cache.read(store, SCOPE, vector, 100)

    # Then only the scores and stamps were searched, nothing read by id, and the turns are as a
    # search of every field gives them
    assert store.searched == [(STAMP,)] and store.retrieved == []
    assert as_read(again) == as_read(first) == full_read(store, vector)
    # And what is worked out from a turn is there: the day it was said, the day "yesterday" is
    assert {known[p.id].day for p in again} == {date(2023, 5, 8)}
    assert known[ids[1]].told() == ((date(2023, 5, 7), date(2023, 5, 8)),) and known[ids[1]].timed()


def test_a_turn_written_since_is_read_again_and_a_forgotten_one_is_gone() -> None:
    # Given turns read once
    store, embedder, ids = remembered()
    cache, vector = TurnCache(), embedder.embed(["spring"])[0]
    cache.read(store, SCOPE, vector, 100)

    # When the second turn is forgotten (elsewhere: nothing tells the cache) and the gap mended
    gone = turns_of(store, SCOPE, ids[1:2])
    store.delete(SCOPE, TURNS, ids[1:2])
    mend_turns(store, embedder, SCOPE, gone)
    store.retrieved.clear()
    points, known = cache.read(store, SCOPE, vector, 100)

    # Then the two mended turns were read again by id, and the read is that of every field
    assert sorted(store.retrieved[0]) == sorted([ids[0], ids[2]])
    assert as_read(points) == full_read(store, vector)
    assert known[ids[0]].payload["next"] == ids[2] and known[ids[2]].payload["previous"] == ids[0]
    # And the forgotten turn is held no more
    assert ids[1] not in cache.held(SCOPE)


def test_turns_without_a_stamp_are_read_whole_every_time() -> None:
    # Given turns stored before they were stamped
    store, embedder, ids = remembered()
    store.set_payload(SCOPE, TURNS, {turn: {STAMP: None} for turn in ids})
    cache, vector = TurnCache(), embedder.embed(["saxophone"])[0]
    cache.read(store, SCOPE, vector, 100)

    # When they are read again
    store.searched.clear()
    points, _ = cache.read(store, SCOPE, vector, 100)

    # Then every payload was searched again
    assert store.searched == [(*TURN_FIELDS, STAMP)]
    assert as_read(points) == full_read(store, vector)


def test_a_drop_forgets_the_turns_and_a_read_under_way_stores_nothing() -> None:
    store, embedder, ids = remembered()
    cache, vector = TurnCache(), embedder.embed(["saxophone"])[0]
    cache.read(store, SCOPE, vector, 100)

    # When two turns are dropped, then the whole dataset
    cache.drop(SCOPE, ids[:2])
    assert sorted(cache.held(SCOPE)) == sorted(ids[2:])
    cache.drop(SCOPE)
    assert cache.held(SCOPE) == {}

    # And a drop comes while a read is under way: that read keeps nothing
    class Dropping(Counted):
        def search(self, *args: Any, **kwargs: Any) -> list[ScoredPoint]:
            cache.drop(SCOPE)
            return super().search(*args, **kwargs)

    dropping = Dropping()
    dropping.ensure_collection(TURNS, embedder.dimension)
    dropping.upsert(SCOPE, TURNS, store.retrieve(SCOPE, TURNS, ids))
    cache.read(dropping, SCOPE, vector, 100)
    assert cache.held(SCOPE) == {}


def test_the_least_recently_read_datasets_go_past_the_bound() -> None:
    other = Scope(tenant="t", dataset="other")
    store, embedder, _ = remembered(other)
    cache, vector = TurnCache(max_turns=len(CHAT)), embedder.embed(["hi"])[0]

    cache.read(store, SCOPE, vector, 100)
    cache.read(store, other, vector, 100)

    assert cache.held(SCOPE) == {} and len(cache.held(other)) == len(CHAT)


def test_a_store_has_one_cache_whatever_view_of_facts_reads_it() -> None:
    from kenning.retrieval.timeline import PointsAt

    store = MemoryVectorStore()
    assert turn_cache(PointsAt(PointsAt(store, None), "2023")) is turn_cache(store)
    assert turn_cache(MemoryVectorStore()) is not turn_cache(store)
