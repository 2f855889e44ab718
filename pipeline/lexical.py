"""Lexical search: the port of a BM25 index over short texts, and its pure tokenizer.

Scoring is Okapi BM25 with k1 = 1.2 and b = 0.75 and the non-negative idf
`ln(1 + (N - df + 0.5) / (df + 0.5))`, summed over the distinct query terms, where N
is the number of indexed texts of the scope and the length of a text is its token count.
Every adapter computes exactly this, so scores agree across adapters.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol

from kenning.pipeline.models import Scope, ScoredPoint

K1 = 1.2
B = 0.75
MAX_TERM_CHARS = 64
MAX_QUERY_TERMS = 64

LexicalEntry = tuple[str, str, dict[str, Any]]

STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves
    """.split()
)

_WORD = re.compile(r"\w+")
_POSSESSIVE = re.compile(r"['’]s\b")
# Plural endings that drop "es" rather than "s": classes, matches, wishes, boxes, buzzes.
_ES_PLURALS = ("sses", "ches", "shes", "xes", "zes")
# Singular words ending in s that a plural stripper must leave alone: glass, virus, analysis.
_NOT_PLURAL = ("ss", "us", "is")


class LexicalIndex(Protocol):
    """A BM25 index of texts by id, scoped by tenant and dataset."""

    def index(self, scope: Scope, entries: Sequence[LexicalEntry]) -> None:
        """Index (id, text, payload) entries; an id indexed again replaces its earlier text and payload."""
        ...

    def search(self, scope: Scope, query: str, limit: int, *, payloads: bool = True) -> list[ScoredPoint]:
        """The best matches of the scope first, at most `limit`, only texts sharing a term with the query.

        `payload["bm25"]` is the BM25 score (higher is better); `score` is the distance-like
        `bm25_distance` of it (lower is closer, in (0, 1]), so hits sort like vector hits. With
        `payloads` off, the payload holds that score alone: the texts' payloads are not read.
        """
        ...

    def remove(self, scope: Scope, ids: Sequence[str]) -> None:
        """Forget these ids of the scope; unknown ids are ignored."""
        ...


def tokenize(text: str) -> list[str]:
    """Index terms of a text: NFKC, case-folded, accents stripped, stop words and single letters
    dropped, plural endings stripped; terms are cut to MAX_TERM_CHARS."""
    folded = _strip_accents(unicodedata.normalize("NFKC", text).casefold())
    words = _WORD.findall(_POSSESSIVE.sub("", folded))
    return [
        _singular(word)[:MAX_TERM_CHARS]
        for word in words
        if word not in STOP_WORDS and (len(word) > 1 or word.isdigit())
    ]


def query_terms(query: str) -> list[str]:
    """The distinct terms of a query, in first-seen order, at most MAX_QUERY_TERMS."""
    return list(dict.fromkeys(tokenize(query)))[:MAX_QUERY_TERMS]


def term_frequencies(text: str) -> tuple[Counter[str], int]:
    """(term -> count, length in tokens) of a text to index."""
    terms = tokenize(text)
    return Counter(terms), len(terms)


def bm25_term(tf: int, df: int, n: int, length: int, average_length: float) -> float:
    """One query term's BM25 contribution to one text."""
    idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
    norm = 1.0 - B + B * length / average_length if average_length > 0 else 1.0
    return idf * tf * (K1 + 1.0) / (tf + K1 * norm)


def bm25_distance(score: float) -> float:
    """A distance-like value of a BM25 score: 1 / (1 + score); higher scores give lower distances."""
    return 1.0 / (1.0 + max(score, 0.0))


def _strip_accents(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(char for char in decomposed if not unicodedata.combining(char))
    return unicodedata.normalize("NFKC", stripped)


def _singular(word: str) -> str:
    if len(word) <= 3 or not word.endswith("s") or word.isdigit():
        return word
    if word.endswith(_ES_PLURALS):
        return word[:-2]
    if word.endswith(_NOT_PLURAL):
        return word
    return word[:-1]
