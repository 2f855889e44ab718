"""In-memory lexical index: the twin of the SQL inverted index, same BM25, same order."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kenning.pipeline.errors import StoreError
from kenning.pipeline.lexical import LexicalEntry, bm25_distance, bm25_term, query_terms, term_frequencies
from kenning.pipeline.models import Scope, ScoredPoint


@dataclass
class _Text:
    terms: Counter[str]
    length: int
    payload: dict[str, Any]


@dataclass
class _Scope:
    texts: dict[str, _Text] = field(default_factory=dict)
    postings: dict[str, set[str]] = field(default_factory=dict)
    total_length: int = 0


class MemoryLexicalIndex:
    """A `LexicalIndex` held in memory, with the semantics of `SqlLexicalIndex`."""

    def __init__(self) -> None:
        self._scopes: dict[Scope, _Scope] = {}
        self._lock = threading.Lock()

    def index(self, scope: Scope, entries: Sequence[LexicalEntry]) -> None:
        staged = {doc_id: _stage(text, payload) for doc_id, text, payload in entries}
        with self._lock:
            target = self._scopes.setdefault(scope, _Scope())
            for doc_id, text in staged.items():
                _drop(target, doc_id)
                target.texts[doc_id] = text
                target.total_length += text.length
                for term in text.terms:
                    target.postings.setdefault(term, set()).add(doc_id)

    def search(self, scope: Scope, query: str, limit: int, *, payloads: bool = True) -> list[ScoredPoint]:
        terms = query_terms(query)
        with self._lock:
            target = self._scopes.get(scope)
            if target is None or limit <= 0 or not terms:
                return []
            scores = _scores(target, terms)
            ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:limit]
            return [
                ScoredPoint(
                    id=doc_id,
                    score=bm25_distance(score),
                    payload={**(_copy(target.texts[doc_id].payload) if payloads else {}), "bm25": score},
                )
                for doc_id, score in ranked
            ]

    def remove(self, scope: Scope, ids: Sequence[str]) -> None:
        with self._lock:
            target = self._scopes.get(scope)
            if target is None:
                return
            for doc_id in ids:
                _drop(target, doc_id)


def _stage(text: str, payload: dict[str, Any]) -> _Text:
    # A JSON round trip stores what the SQL adapter would store and detaches it from the caller.
    try:
        stored: dict[str, Any] = json.loads(json.dumps(payload))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"lexical payload is not JSON: {exc}") from exc
    terms, length = term_frequencies(text)
    return _Text(terms, length, stored)


def _drop(target: _Scope, doc_id: str) -> None:
    old = target.texts.pop(doc_id, None)
    if old is None:
        return
    target.total_length -= old.length
    for term in old.terms:
        holders = target.postings[term]
        holders.discard(doc_id)
        if not holders:
            del target.postings[term]


def _scores(target: _Scope, terms: list[str]) -> dict[str, float]:
    n = len(target.texts)
    average = target.total_length / n if n else 0.0
    scores: dict[str, float] = {}
    for term in terms:
        holders = target.postings.get(term, set())
        for doc_id in holders:
            text = target.texts[doc_id]
            weight = bm25_term(text.terms[term], len(holders), n, text.length, average)
            scores[doc_id] = scores.get(doc_id, 0.0) + weight
    return scores


def _copy(payload: dict[str, Any]) -> dict[str, Any]:
    """A payload as a store would give it back: through JSON."""
    copied: dict[str, Any] = json.loads(json.dumps(payload))
    return copied
