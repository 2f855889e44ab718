"""One check for the names a caller gives (datasets, users), used by every surface: the Python
facade, the HTTP API, the CLI and the MCP tools."""

from __future__ import annotations

import unicodedata

from kenning.pipeline.errors import InputError

MAX_NAME_CHARS = 255
# Control characters, surrogates, line and paragraph separators, and the bidirectional
# overrides: none prints as itself, and some rewrite what a terminal shows.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


def name_problem(value: str) -> str:
    """Why `value` is not a valid dataset or user name; "" when it is."""
    if not value or value.strip() != value:
        return "must be non-empty, with no space at either end"
    if len(value) > MAX_NAME_CHARS:
        return f"is {len(value)} characters long; at most {MAX_NAME_CHARS}"
    if "/" in value:
        return "must not hold '/' (a read scope is tenant/dataset)"
    for char in value:
        if char in _BIDI or unicodedata.category(char) in _REFUSED_CATEGORIES:
            return f"must not hold the control character U+{ord(char):04X}"
    return ""


def check_name(field: str, value: str) -> str:
    """`value` if it is a valid name; an InputError naming `field` and what is wrong otherwise."""
    problem = name_problem(value)
    if problem:
        raise InputError(f"{field} {problem}")
    return value
