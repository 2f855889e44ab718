"""A scope's BM25 posting lists held in memory as numpy arrays, for searches in milliseconds.

`SqlLexicalIndex` keeps the index in SQL tables, where one search joins and sums every posting
of the query's terms (about 130 ms on 6,119 paragraphs on SQLite). A `Snapshot` is the same
postings read once, in compressed sparse rows: grouped by term, `starts[i]:starts[i + 1]`
the postings of term i (text index and term frequency). A search adds each query term's BM25
weights into one score array and keeps the best. Scores are the formula of `kenning.pipeline.lexical`,
term by term as the SQL query computes them.

A snapshot is only ever used at the revision of the scope it was read at (`kenning.storage.sql.snapshots`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kenning.pipeline.lexical import K1, B

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
    def size(self) -> int:
        """Postings held."""
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
