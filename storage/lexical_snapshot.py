"""A scope's BM25 posting lists held in memory as numpy arrays, for searches in milliseconds.

`SqlLexicalIndex` keeps the index in SQL tables, where one search joins and sums every posting
of the query's terms (about 130 ms on 6,119 paragraphs on SQLite). A `Snapshot` is the same
postings read once, in compressed sparse rows: grouped by term, `starts[i]:starts[i + 1]`
the postings of term i (text index and term frequency). A search adds each query term's BM25
weights into one score array and keeps the best. Scores are the formula of `pipeline.lexical`,
term by term as the SQL query computes them.

A snapshot is only ever used at the revision of the scope it was read at: the SQL index bumps
a scope's revision with every write, and a search whose scope has moved on is answered from
SQL while a new snapshot is read. `Snapshots` keeps the most recently used of them, within a
bound on the postings held.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kenning.pipeline.lexical import K1, B

Key = tuple[str, str]

# Postings held by all the snapshots of one index at most (8 bytes each in arrays, plus the
# term and id strings): about 100 MB at the default.
MAX_POSTINGS = 5_000_000


@dataclass(frozen=True)
class Snapshot:
    """The postings of one scope at one revision."""

    revision: int
    doc_ids: list[str]  # sorted: index order is id order, for ties
    lengths: npt.NDArray[np.float64]
    terms: dict[str, int]
    starts: npt.NDArray[np.int64]
    docs: npt.NDArray[np.int32]
    tfs: npt.NDArray[np.float64]

    @property
    def postings(self) -> int:
        return len(self.docs)

    @classmethod
    def read(
        cls, revision: int, lengths: Iterable[tuple[str, int]], postings: Iterable[tuple[str, str, int]]
    ) -> Snapshot:
        """From (doc id, length) rows and (term, doc id, tf) rows, in any order."""
        by_id = dict(lengths)
        doc_ids = sorted(by_id)
        position = {doc_id: index for index, doc_id in enumerate(doc_ids)}
        terms: dict[str, int] = {}
        term_of: list[int] = []
        doc_of: list[int] = []
        tf_of: list[int] = []
        for term, doc_id, tf in postings:
            at = position.get(doc_id)
            if at is not None:
                term_of.append(terms.setdefault(term, len(terms)))
                doc_of.append(at)
                tf_of.append(tf)
        order = np.argsort(np.array(term_of, dtype=np.int64), kind="stable")
        counts = np.bincount(np.array(term_of, dtype=np.int64), minlength=len(terms))
        return cls(
            revision=revision,
            doc_ids=doc_ids,
            lengths=np.array([by_id[doc_id] for doc_id in doc_ids], dtype=np.float64),
            terms=terms,
            starts=np.concatenate(([0], np.cumsum(counts))).astype(np.int64),
            docs=np.array(doc_of, dtype=np.int32)[order],
            tfs=np.array(tf_of, dtype=np.float64)[order],
        )

    def search(self, terms: Sequence[str], limit: int) -> list[tuple[str, float]]:
        """The best `limit` (doc id, BM25 score), best first, ties by id; only texts sharing a term."""
        n = len(self.doc_ids)
        if not n or limit <= 0:
            return []
        average = float(self.lengths.sum()) / n
        scores = np.zeros(n, dtype=np.float64)
        touched = np.zeros(n, dtype=bool)
        for term in dict.fromkeys(terms):
            index = self.terms.get(term)
            if index is None:
                continue
            begin, end = int(self.starts[index]), int(self.starts[index + 1])
            docs, tf = self.docs[begin:end], self.tfs[begin:end]
            df = float(end - begin)
            idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
            norm = 1.0 - B + B * self.lengths[docs] / average
            scores[docs] += idf * tf * (K1 + 1.0) / (tf + K1 * norm)
            touched[docs] = True
        found = np.flatnonzero(touched)
        if len(found) > limit:
            # Keep every text scoring at least the limit-th best, so that ties are broken by id.
            cut = np.partition(scores[found], len(found) - limit)[len(found) - limit]
            found = found[scores[found] >= cut]
        order = found[np.lexsort((found, -scores[found]))][:limit]
        return [(self.doc_ids[index], float(scores[index])) for index in order]


class Snapshots:
    """The snapshots of an index's scopes, most recently used kept, within `max_postings`.

    Thread-safe; a scope is read by one thread at a time (`begin_read` says whether this one),
    and a scope found larger than the bound is not read again by this process.
    """

    def __init__(self, max_postings: int = MAX_POSTINGS) -> None:
        self._max_postings = max_postings
        self._held: OrderedDict[Key, Snapshot] = OrderedDict()
        self._reading: set[Key] = set()
        self._oversized: set[Key] = set()
        self._searched: set[Key] = set()
        self._lock = threading.Lock()

    def searched_before(self, key: Key) -> bool:
        """Whether the scope was searched before in this process (and note that it was now): a
        process that searches a scope once, such as one `kenning search`, never reads it."""
        with self._lock:
            if key in self._searched:
                return True
            self._searched.add(key)
            return False

    def get(self, key: Key, revision: int) -> Snapshot | None:
        """The scope's snapshot if it is at `revision`."""
        with self._lock:
            snapshot = self._held.get(key)
            if snapshot is None or snapshot.revision != revision:
                return None
            self._held.move_to_end(key)
            return snapshot

    def revision(self, key: Key) -> int | None:
        """The revision of the scope's snapshot held, None when none is."""
        with self._lock:
            snapshot = self._held.get(key)
            return None if snapshot is None else snapshot.revision

    def begin_read(self, key: Key) -> bool:
        """Whether this thread is to read the scope (no other is reading it now)."""
        with self._lock:
            if key in self._reading or key in self._oversized:
                return False
            self._reading.add(key)
            return True

    def end_read(self, key: Key, snapshot: Snapshot | None) -> None:
        """Keep what was read (None: nothing usable), dropping the least recently used beyond the bound."""
        with self._lock:
            self._reading.discard(key)
            self._held.pop(key, None)
            if snapshot is None:
                return
            if snapshot.postings > self._max_postings:
                self._oversized.add(key)
                return
            self._held[key] = snapshot
            while sum(held.postings for held in self._held.values()) > self._max_postings:
                self._held.popitem(last=False)
