"""Text primitives shared by chunking and the offline extractor."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import inflect

_TOKEN = re.compile(r"\w+|[^\w\s]")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_PARAGRAPH = re.compile(r"\n\s*\n")


_IMPORTING = threading.Lock()
_T = TypeVar("_T")


@cache
def inflector() -> inflect.engine:
    """The inflect engine (singulars and plurals), imported on first use, and imported without
    inflect's run-time type checks: typeguard rebuilds every checked function from its source as
    the module loads, about 3 s of CPU per process (a tenth of a 1,000-paragraph cognify), to
    check argument types that here are always `str`."""
    with _IMPORTING:
        import typeguard

        checked = typeguard.typechecked
        typeguard.typechecked = _unchecked  # type: ignore[assignment]
        try:
            import inflect
        finally:
            typeguard.typechecked = checked
    return inflect.engine()


def _unchecked(target: _T | None = None, **_options: Any) -> _T | Callable[[_T], _T]:
    """`typeguard.typechecked` that checks nothing: the target itself, bare or with options."""
    if target is None:
        return lambda function: function
    return target


def count_tokens(text: str) -> int:
    """An estimate of model tokens: words and punctuation marks."""
    return sum(1 for _ in _TOKEN.finditer(text))


def paragraphs(text: str) -> Iterator[str]:
    for block in _PARAGRAPH.split(text):
        block = " ".join(block.split())
        if block:
            yield block


def sentences(paragraph: str) -> list[str]:
    return [part.strip() for part in _SENTENCE_END.split(paragraph) if part.strip()]


def split_words(text: str, max_tokens: int) -> Iterator[str]:
    """Cut an over-long sentence into pieces of at most `max_tokens` tokens."""
    words = text.split()
    piece: list[str] = []
    size = 0
    for word in words:
        cost = count_tokens(word)
        if piece and size + cost > max_tokens:
            yield " ".join(piece)
            piece, size = [], 0
        piece.append(word)
        size += cost
    if piece:
        yield " ".join(piece)
