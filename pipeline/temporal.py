"""Time in text: events with the dates they mention, and the time range a question asks about.

Dates become day ranges (proleptic Gregorian ordinals): "1920" is the whole year,
"March 1920" the month, "5 March 1920" the day. Both extraction and question parsing
are deterministic and need no LLM.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

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


# When a fact held: moments as the text gives them, at its precision: "2024" (a year), "2024-05"
# (a month), "2024-05-02" (a day) or "2024-05-02T10:00:00Z" (an instant, in UTC). A moment starts
# its period: a fact stated "in 2024-05" holds from 1 May 2024.

_ISO_DAY = re.compile(r"\b(?P<year>1\d{3}|20\d{2})-(?P<month>0[1-9]|1[0-2])(?:-(?P<day>[0-3]\d))?\b")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(?P<body>.*?\n)---[ \t]*(?:\n|\Z)", re.DOTALL)
_FRONT_DATE = re.compile(
    r"^(?:date|time|created|published)\s*:\s*['\"]?(?P<value>[^'\"\n]+?)['\"]?\s*$", re.M
)
_MESSAGE_TIME = re.compile(r"\A\[(?P<value>[0-9][0-9T:.+-]{9,40})\] ")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_NUMBERS.update({"seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12})
_AGO = re.compile(
    r"\b(?P<count>\d{1,3}|" + "|".join(_NUMBERS) + r")\s+(?P<unit>day|week|month|year)s?\s+ago\b",
    re.IGNORECASE,
)
_LAST = re.compile(
    r"\b(?:last|past|previous)\s+(?P<unit>week|month|year)\b|\b(?P<yesterday>yesterday)\b", re.I
)
# A date right after these words is no time of the fact: "born in 1990", "founded in 1921".
_NOT_FACT_TIME = re.compile(r"\b(?:born|died|founded|established|built|since birth)\W+(?:\w+\W+)?$", re.I)


def moment(value: datetime | date) -> str:
    """The moment of a date (a day) or a date and time (an instant in UTC; a naive one is UTC)."""
    if isinstance(value, datetime):
        instant = value if value.tzinfo else value.replace(tzinfo=UTC)
        return instant.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
    return value.isoformat()


def parse_moment(text: str) -> str:
    """A moment from what a person writes: a year, a month (2024-05), a day, or an ISO 8601 date
    and time; ValueError saying what is accepted, for anything else."""
    value = text.strip()
    if re.fullmatch(r"(1\d{3}|20\d{2})", value):
        return value
    if re.fullmatch(r"(1\d{3}|20\d{2})-(0[1-9]|1[0-2])", value):
        return value
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return moment(date.fromisoformat(value))
        return moment(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        pass
    raise ValueError(f"{text!r} is no time: expected a year, YYYY-MM, a date or an ISO 8601 date and time")


def moment_start(label: str) -> datetime:
    """The first instant of a moment's period (UTC)."""
    if label.endswith("Z"):
        return datetime.fromisoformat(label[:-1]).replace(tzinfo=UTC)
    parts = [int(part) for part in label.split("-")]
    year, month, day = (parts + [1, 1])[:3]
    return datetime(year, month, day, tzinfo=UTC)


def moment_last(label: str) -> datetime:
    """The last instant of a moment's period: "as of 2023" is the end of 2023."""
    if label.endswith("Z"):
        return moment_start(label)
    parts = [int(part) for part in label.split("-")]
    if len(parts) == 1:
        after = datetime(parts[0] + 1, 1, 1, tzinfo=UTC)
    elif len(parts) == 2:
        after = datetime(parts[0] + parts[1] // 12, parts[1] % 12 + 1, 1, tzinfo=UTC)
    else:
        after = moment_start(label) + timedelta(days=1)
    return after - timedelta(microseconds=1)


def document_time(text: str) -> str | None:
    """The moment a text gives for itself: a remembered message's `[time]`, an ISO date as its
    first line, or a `date:` in its front matter; None when it gives none."""
    said = _MESSAGE_TIME.match(text)
    if said:
        return _moment_or_none(said.group("value"))
    front = _FRONT_MATTER.match(text)
    if front:
        found = _FRONT_DATE.search(front.group("body"))
        return _moment_or_none(found.group("value")) if found else None
    first = text.lstrip().split("\n", 1)[0].strip()
    return _moment_or_none(first) if re.fullmatch(r"\d{4}-\d{2}(-\d{2})?([T ][0-9:.+Z-]+)?", first) else None


def _moment_or_none(value: str) -> str | None:
    try:
        return parse_moment(value)
    except ValueError:
        return None


def stated_time(sentence: str, reference: str) -> str:
    """When the sentence says its fact began: its first date no later than `reference` (the
    moment of the text it is in), a relative one ("last month", "three weeks ago") counted back
    from `reference`, else `reference` itself."""
    limit = moment_last(reference)
    for label, start in _dates_in(sentence):
        if moment_start(label) <= limit and not _NOT_FACT_TIME.search(sentence[:start]):
            return label
    relative = _relative(sentence, moment_start(reference))
    return relative or reference


def _dates_in(sentence: str) -> list[tuple[str, int]]:
    found = [(m.group(0), m.start()) for m in _ISO_DAY.finditer(sentence)]
    taken = [(m.start(), m.end()) for m in _ISO_DAY.finditer(sentence)]
    for m in _DATE.finditer(sentence):
        if len(m.group("year")) != 4 and not m.group("month"):
            continue
        if any(start <= m.start() < end for start, end in taken):
            continue
        found.append((date_span(m)[2], m.start()))
    return sorted(found, key=lambda item: item[1])


def _relative(sentence: str, reference: datetime) -> str | None:
    ago = _AGO.search(sentence)
    if ago:
        word = ago.group("count").lower()
        count = int(word) if word.isdigit() else _NUMBERS[word]
        return _back(reference, ago.group("unit").lower(), count)
    last = _LAST.search(sentence)
    if last:
        return _back(reference, "day" if last.group("yesterday") else last.group("unit").lower(), 1)
    return None


def _back(reference: datetime, unit: str, count: int) -> str:
    if unit == "year":
        return f"{reference.year - count:04}"
    if unit == "month":
        months = reference.year * 12 + reference.month - 1 - count
        return f"{months // 12:04}-{months % 12 + 1:02}"
    days = count * (7 if unit == "week" else 1)
    return (reference.date() - timedelta(days=days)).isoformat()
