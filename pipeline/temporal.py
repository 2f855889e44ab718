"""Time in text: events with the dates they mention, and the time range a question asks about.

Dates become day ranges (proleptic Gregorian ordinals): "1920" is the whole year,
"March 1920" the month, "5 March 1920" the day. Both extraction and question parsing
are deterministic and need no LLM.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from datetime import date

from pydantic import BaseModel

from kenning.pipeline.models import DataPoint
from kenning.pipeline.text import paragraphs, sentences

MONTHS = {name.lower(): number for number, name in enumerate(calendar.month_name) if name}
MONTHS.update({name.lower(): number for number, name in enumerate(calendar.month_abbr) if name})
_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_DATE = re.compile(
    rf"\b(?:(?P<day>[0-3]?\d)\s+)?(?:(?P<month>{_MONTH})\.?\s+)?(?:(?P<day2>[0-3]?\d),\s+)?(?P<year>1\d{{3}}|20\d{{2}}|[1-9]\d{{2}})\b",
    re.IGNORECASE,
)
_BETWEEN = re.compile(r"\b(?:between|from)\s+(.+?)\s+(?:and|to|until)\s+(.+?)(?:[?.,;]|$)", re.IGNORECASE)
_BEFORE = re.compile(r"\b(?:before|until|prior to|by)\s+(.+?)(?:[?.,;]|$)", re.IGNORECASE)
_AFTER = re.compile(r"\b(?:after|since|from)\s+(.+?)(?:[?.,;]|$)", re.IGNORECASE)
MAX_EVENT_CHARS = 400


class TimeRange(BaseModel):
    """Inclusive day range as date ordinals; an open end is None."""

    start: int | None = None
    end: int | None = None

    def overlaps(self, start: int, end: int) -> bool:
        return (self.start is None or end >= self.start) and (self.end is None or start <= self.end)


class Event(DataPoint):
    identity = ("text",)
    index_fields = ("text",)

    name: str
    text: str
    time_from: int
    time_to: int
    label: str


class Timestamp(DataPoint):
    identity = ("label",)

    label: str
    time_from: int
    time_to: int


def date_span(match: re.Match[str]) -> tuple[int, int, str]:
    """The day range a date mention covers, and its label (YYYY, YYYY-MM or YYYY-MM-DD)."""
    year = int(match.group("year"))
    month_name = (match.group("month") or "").lower()
    day_text = match.group("day") or match.group("day2")
    if not month_name:
        return date(year, 1, 1).toordinal(), date(year, 12, 31).toordinal(), f"{year:04}"
    month = MONTHS[month_name]
    last = calendar.monthrange(year, month)[1]
    day = int(day_text) if day_text and 1 <= int(day_text) <= last else 0
    if day:
        ordinal = date(year, month, day).toordinal()
        return ordinal, ordinal, f"{year:04}-{month:02}-{day:02}"
    return date(year, month, 1).toordinal(), date(year, month, last).toordinal(), f"{year:04}-{month:02}"


def spans(text: str) -> list[tuple[int, int, str]]:
    # A three-digit number is a year only with a month ("11 November 875"), never alone.
    return [date_span(m) for m in _DATE.finditer(text) if len(m.group("year")) == 4 or m.group("month")]


def extract_events(text: str) -> Iterator[tuple[str, int, int, str]]:
    """(sentence, start, end, label) for every sentence that mentions a date: its first date."""
    for paragraph in paragraphs(text):
        for sentence in sentences(paragraph):
            found = spans(sentence)
            if found:
                start, end, label = found[0]
                yield sentence[:MAX_EVENT_CHARS], start, end, label


def question_range(question: str) -> TimeRange | None:
    """The time range a question asks about, or None when it names no date."""
    between = _BETWEEN.search(question)
    if between:
        low, high = spans(between.group(1)), spans(between.group(2))
        if low and high:
            return TimeRange(start=low[0][0], end=high[0][1])
    before = _BEFORE.search(question)
    if before and spans(before.group(1)):
        return TimeRange(end=spans(before.group(1))[0][0] - 1)
    after = _AFTER.search(question)
    if after and spans(after.group(1)):
        return TimeRange(start=spans(after.group(1))[0][1] + 1)
    found = spans(question)
    if not found:
        return None
    return TimeRange(start=min(s for s, _, _ in found), end=max(e for _, e, _ in found))
