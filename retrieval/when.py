"""The calendar days and months a query names, as half-open date ranges.

Agents ask "what did Gina find on 1 February, 2023?" or "what happened in June 2023?": a
query that names a day or a month asks about what was said then. Only explicit dates are
read (a day with its month and year, in either order, a month with its year, or an ISO
date); relative ones ("last week") need a reference time the query does not carry.
"""

from __future__ import annotations

import calendar
import re
from datetime import date, timedelta

Span = tuple[date, date]  # [start, end): the days a query names
# Month names that are also everyday words count only when capitalised: "you may 2023" is no date.
_WORDS_TOO = frozenset({"may", "march"})

_MONTHS = {name.casefold(): n for n, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.casefold(): n for n, name in enumerate(calendar.month_abbr) if name}
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r",?\s+(?P<year>\d{4})\b"
_PATTERNS = (
    re.compile(r"\b(?P<iso_year>\d{4})-(?P<iso_month>\d{2})-(?P<iso_day>\d{2})(?!\d)"),
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}{_YEAR}", re.IGNORECASE),
    re.compile(rf"\b{_MONTH}\s+{_DAY}{_YEAR}", re.IGNORECASE),
    re.compile(rf"\b{_MONTH}{_YEAR}", re.IGNORECASE),
)


def named_spans(query: str) -> list[Span]:
    """The days and months the query names, in the order of the patterns; impossible dates
    (31 February) are skipped. A date is read once: its words are not read again as a month."""
    spans: list[Span] = []
    rest = query
    for pattern in _PATTERNS:
        for match in pattern.finditer(rest):
            span = _span(match)
            if span is not None:
                spans.append(span)
        rest = pattern.sub(" ", rest)
    return spans


def within(day: date, spans: list[Span]) -> bool:
    return any(start <= day < end for start, end in spans)


def _span(match: re.Match[str]) -> Span | None:
    """The range of one match; None for an impossible date, one past the calendar's end, or a
    month name in lower case that is also an everyday word."""
    found = match.groupdict()
    try:
        if found.get("iso_year"):
            day = date(int(found["iso_year"]), int(found["iso_month"]), int(found["iso_day"]))
            return day, day + timedelta(days=1)
        name = found["month"]
        if name.casefold() in _WORDS_TOO and not name[0].isupper():
            return None
        year, month = int(found["year"]), _MONTHS[name.casefold()]
        if found.get("day"):
            day = date(year, month, int(found["day"]))
            return day, day + timedelta(days=1)
        return date(year, month, 1), date(year + month // 12, month % 12 + 1, 1)
    except (ValueError, OverflowError):
        return None
