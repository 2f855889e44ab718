"""What CONVERSATION keeps of a dataset's turns between queries, and how it knows it still holds.

Every query ranks all of a dataset's turns (`ConversationConfig.max_turns`), so it reads each
turn's score, and its payload: text, links, speaker and time. Reading the payloads of a few
hundred turns cost more than the search itself, and what is worked out from them (the day a
turn was said, the days its words speak of, whether it says a time) cost up to 100 ms the first
time a question asked "when". Both are kept here, by turn, for the next query.

The turns' payloads are stamped: every write of a turn's fields (`TURN_FIELDS`), which only
`kenning.retrieval.conversation` makes (`turn_points` for a remember, `mend_turns` after a
forget), gives it a new random `stamp` in the same operation. So a query reads the scores and
stamps of every turn, and the rest of a payload only for a turn whose stamp it has not seen:
one written since, by this process or any other. A turn with no stamp (indexed before stamps)
is read whole each time. What is worked out from a payload is kept with the text and time it
came from, and worked out again when they differ.

A dataset's entry holds the turns its last read found, no others. `forget` in this process
drops what it forgets at once (`forget_turns`); a turn deleted any other way (by another
process, or a message replaced under its id) goes at the next read of its dataset. Entries are
kept for the `MAX_TURNS` most recently read turns in all.
"""

from __future__ import annotations

import re
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

from kenning.pipeline.models import Scope, ScoredPoint
from kenning.pipeline.ports import VectorStore
from kenning.retrieval import when
from kenning.retrieval.timeline import PointsAt
from kenning.retrieval.when import Span

TURNS = "ConversationTurn_text"
TURN_FIELDS = ("text", "data_ids", "document_id", "previous", "next", "speaker", "said_at")
STAMP = "stamp"
# The turns kept in all, over every dataset (the least recently read datasets go first).
MAX_TURNS = 50_000
# More turns than this unseen by a query: it reads every payload in one search, not by id.
MAX_UNSEEN = 64
TIME = re.compile(r"^\[[^\]]*\] ")  # the `[time] ` a message's text starts with


def new_stamp() -> str:
    return uuid.uuid4().hex


_UNREAD = date.min  # `Known.day` not worked out yet (no turn is said on 1 January of year 1)


class Known:
    """A turn's payload (its `TURN_FIELDS`, and stamp) and what is worked out from it, lazily."""

    __slots__ = ("payload", "stamp", "_day", "_words", "_told", "_timed")

    def __init__(self, payload: Mapping[str, Any], stamp: str | None) -> None:
        self.payload = payload
        self.stamp = stamp
        self._day: date | None = _UNREAD
        self._words: str | None = None
        self._told: tuple[Span, ...] | None = None
        self._timed: bool | None = None

    @property
    def text(self) -> str:
        return str(self.payload.get("text", ""))

    @property
    def said_at(self) -> str:
        return str(self.payload.get("said_at") or "")

    @property
    def day(self) -> date | None:
        """The day the turn was said: its `said_at`, else the `[time] ` its text starts with."""
        if self._day is _UNREAD:
            self._day = said_on(self.payload)
        return self._day

    @property
    def words(self) -> str:
        """The turn's own words, without the time its text starts with."""
        if self._words is None:
            self._words = TIME.sub("", self.text, count=1)
        return self._words

    def told(self) -> tuple[Span, ...]:
        """The days its words speak of, read against the day it was said (none without one)."""
        if self._told is None:
            day = self.day
            self._told = when.told(self.words, day) if day else ()
        return self._told

    def timed(self) -> bool:
        """Whether its words say a time or a length of time."""
        if self._timed is None:
            self._timed = when.timed(self.words)
        return self._timed

    def carried(self, payload: Mapping[str, Any], stamp: str | None) -> Known:
        """This turn as `payload` reads it now: what was worked out is kept if its text and time
        are those it was worked out from."""
        fresh = Known(payload, stamp)
        if fresh.text == self.text and fresh.said_at == self.said_at:
            fresh._day, fresh._words = self._day, self._words
            fresh._told, fresh._timed = self._told, self._timed
        return fresh


def said_on(payload: Mapping[str, Any]) -> date | None:
    """The day a turn was said: its `said_at`, else the `[time] ` its text starts with."""
    said = str(payload.get("said_at") or "")
    if not said:
        stamp = TIME.match(str(payload.get("text", "")))
        said = stamp.group(0)[1:-2] if stamp else ""
    try:
        return date.fromisoformat(said[:10])
    except ValueError:
        return None


class TurnCache:
    """The turns of each dataset as last read, by turn id; thread-safe."""

    def __init__(self, max_turns: int = MAX_TURNS) -> None:
        self._max_turns = max_turns
        self._held: OrderedDict[tuple[str, str], dict[str, Known]] = OrderedDict()
        # Bumped by every drop: a read begun before a forget stores nothing.
        self._generation: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def read(
        self, vectors: VectorStore, scope: Scope, vector: Sequence[float], limit: int
    ) -> tuple[list[ScoredPoint], dict[str, Known]]:
        """The scope's `limit` closest turns, closest first, each with its `TURN_FIELDS` payload (as
        `vectors.search` gives them), and what is known of each. A payload may be the one kept:
        read it, never change it."""
        key = (scope.tenant, scope.dataset)
        with self._lock:
            generation = self._generation.get(key, 0)
            held = self._held.get(key) or {}
        kept: dict[str, Known] = {}
        if not held or any(known.stamp is None for known in held.values()):
            # None held, or turns indexed before stamps: every payload is read.
            points = vectors.search(scope, TURNS, vector, limit, [*TURN_FIELDS, STAMP])
        else:
            points = self._stamped(vectors, scope, vector, limit, held, kept)
        known = {}
        for point in points:
            same = kept.get(point.id)
            if same is not None:
                known[point.id] = same
                continue
            stamp, before = _stamp(point.payload), held.get(point.id)
            known[point.id] = before.carried(point.payload, stamp) if before else Known(point.payload, stamp)
        self._store(key, generation, known)
        return points, known

    def _stamped(
        self,
        vectors: VectorStore,
        scope: Scope,
        vector: Sequence[float],
        limit: int,
        held: dict[str, Known],
        kept: dict[str, Known],
    ) -> list[ScoredPoint]:
        """The search's scores and stamps, with the payloads held for the stamps seen before (those
        turns noted in `kept`); the others read by id (all of them in one search again, when there
        are many)."""
        points = vectors.search(scope, TURNS, vector, limit, [STAMP])
        unseen = []
        for point in points:
            before = held.get(point.id)
            if before is not None and before.stamp is not None and before.stamp == point.payload.get(STAMP):
                point.payload = before.payload  # type: ignore[assignment]  # read only, as kept
                kept[point.id] = before
            else:
                unseen.append(point.id)
        if len(unseen) > MAX_UNSEEN:
            kept.clear()
            return vectors.search(scope, TURNS, vector, limit, [*TURN_FIELDS, STAMP])
        if unseen:
            found = {p.id: p.payload for p in vectors.retrieve(scope, TURNS, unseen, [*TURN_FIELDS, STAMP])}
            for point in points:
                if point.id in found:
                    point.payload = found[point.id]
            # A turn forgotten between the two reads is left out.
            points = [point for point in points if point.id not in unseen or point.id in found]
        return points

    def _store(self, key: tuple[str, str], generation: int, known: dict[str, Known]) -> None:
        with self._lock:
            if self._generation.get(key, 0) != generation:
                return
            self._held[key] = known
            self._held.move_to_end(key)
            while len(self._held) > 1 and sum(len(turns) for turns in self._held.values()) > self._max_turns:
                self._held.popitem(last=False)

    def drop(self, scope: Scope, turn_ids: Sequence[str] | None = None) -> None:
        """Forget these turns of the scope (None: all of them), and any read of it under way."""
        key = (scope.tenant, scope.dataset)
        with self._lock:
            self._generation[key] = self._generation.get(key, 0) + 1
            held = self._held.get(key)
            if held is None:
                return
            if turn_ids is None:
                del self._held[key]
                return
            gone = set(turn_ids)
            self._held[key] = {turn: known for turn, known in held.items() if turn not in gone}

    def held(self, scope: Scope) -> dict[str, Known]:
        """What is held of the scope's turns, by id (a copy)."""
        with self._lock:
            return dict(self._held.get((scope.tenant, scope.dataset), {}))


_CACHES: weakref.WeakKeyDictionary[object, TurnCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def turn_cache(vectors: VectorStore) -> TurnCache:
    """The turn cache of a vector store (the store under views of facts at a moment), living as
    long as the store does."""
    store: object = vectors
    while isinstance(store, PointsAt):
        store = store._inner
    with _CACHES_LOCK:
        cache = _CACHES.get(store)
        if cache is None:
            cache = _CACHES[store] = TurnCache()
        return cache


def forget_turns(vectors: VectorStore, scope: Scope, turn_ids: Sequence[str] | None = None) -> None:
    """Drop forgotten turns (chunk ids; None: the whole dataset's) from the store's turn cache."""
    turn_cache(vectors).drop(scope, turn_ids)


def _stamp(payload: Mapping[str, Any]) -> str | None:
    stamp = payload.get(STAMP)
    return str(stamp) if stamp else None
