"""Time in words: the days a query or a message names, whether a query asks for a time, and in what order.

Agents ask "what did Gina find on 1 February, 2023?", "what did we talk about last week?",
"when did Ben start the new job?" or "what did Ada cook the first time?". Read here:
- explicit dates: a day with its month and year (either order), a month with its year, an ISO
  date (`named_spans`, which needs no reference day); and, with one, a month alone ("in June",
  the nearest June), a year after a preposition ("in 2022", "since 2016"), a season;
- relative expressions, against a reference day: "yesterday", "today", "three weeks ago",
  "a couple of months back", "last week", "this month", "next Friday", "last weekend", "in the
  past 10 days", and "the day / week / Friday before 3 May 2023" (a unit before or after a date);
  a unit beside an event ("the day before the concert") is kept as `Asked.anchor`, for the
  caller to read beside the day the event was spoken of (`anchored`);
- open ranges: "since X", "after X", "before X", "until X", X any of the above;
- what the query asks: a time ("when", "what year", "which month", "how long", "how many weeks
  ago") and an order ("the first time", "earliest"; "most recently", "the last time").

The reference day of a question is the last day its memory was spoken on (see CONVERSATION); that
of a message is the day it was said, so "yesterday" in a message said on 8 May 2023 is 7 May.
Weeks run Monday to Sunday; seasons are the northern ones. This is a small grammar of English
time words, not a general date parser: `dateparser` (tried, 1.5.0) finds such expressions too,
but took 15 to 30 ms per relative expression after a one-second first load, answers one instant
without its granularity ("last week" is a single day), and reads "May I" and "the march" as months.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta

Span = tuple[date, date]  # [start, end): the days an expression names
EVER: Span = (date.min, date.max)
# Month names that are also everyday words count only when capitalised: "you may 2023" is no date.
_WORDS_TOO = frozenset({"may", "march"})

_MONTHS = {name.casefold(): n for n, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.casefold(): n for n, name in enumerate(calendar.month_abbr) if name}
_MONTHS["sept"] = 9
_WEEKDAYS = {name.casefold(): n for n, name in enumerate(calendar.day_name)}
_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
    "thirty": 30, "a couple of": 2, "a couple": 2, "couple of": 2, "a few": 3, "few": 3, "several": 3,
}  # fmt: skip
_SEASONS = {"spring": 3, "summer": 6, "fall": 9, "autumn": 9, "winter": 12}

_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r",?\s+(?P<year>\d{4})\b"
_EXPLICIT = (
    re.compile(r"\b(?P<iso_year>\d{4})-(?P<iso_month>\d{2})-(?P<iso_day>\d{2})(?!\d)"),
    re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}{_YEAR}", re.IGNORECASE),
    re.compile(rf"\b{_MONTH}\s+{_DAY}{_YEAR}", re.IGNORECASE),
    re.compile(rf"\b{_MONTH}{_YEAR}", re.IGNORECASE),
)
_NUM = r"(?P<n>\d{1,3}|" + "|".join(sorted(map(re.escape, _NUMBERS), key=len, reverse=True)) + r")"
_UNIT = r"(?P<unit>day|week(?:end)?|fortnight|month|year)s?"
_WEEKDAY = r"(?P<weekday>" + "|".join(_WEEKDAYS) + r")s?"
_SEASON = r"(?P<season>" + "|".join(_SEASONS) + r")"
_RELATIVE = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"\b(?P<word>the day before yesterday|yesterday|today|tonight|this morning|this afternoon"
        r"|this evening|tomorrow|the day after tomorrow|the other day)\b",
        rf"\b(?:in|over|during|within|for)\s+the\s+(?:last|past|previous)\s+{_NUM}\s+{_UNIT}",
        rf"\b{_NUM}\s+{_UNIT}\s+(?P<ago>ago|back|earlier|later|from now)\b",
        rf"\b(?P<which>last|past|previous|this|next|coming)\s+(?:{_UNIT}|{_WEEKDAY}|{_SEASON})\b",
        rf"\b(?:on\s+)?{_WEEKDAY}\b",
        rf"\b(?:(?:in|during|this)\s+(?:the\s+)?){_SEASON}(?:\s+of\s+(?P<year>\d{{4}}))?\b",
        rf"\b(?P<cue>in|during|of|since|from|until|till|before|after|by)\s+(?:early\s+|late\s+|mid-?)?"
        rf"(?P<month>{'|'.join(calendar.month_name[1:])})\b(?!\s*,?\s*\d)",
        r"\b(?P<cue>in|during|since|from|until|till|before|after|by|of|around)\s+(?:early\s+|late\s+)?"
        r"(?P<year>(?:19|20)\d{2})\b(?!-\d)",
    )
)
# "the week before 3 May 2023", "the Friday after ...": a unit beside a date.
_BESIDE = re.compile(
    rf"\b(?:the\s+)?(?:{_NUM}\s+)?(?:{_UNIT}|{_WEEKDAY})\s+(?P<side>before|after|of|prior to|following)\s+$",
    re.IGNORECASE,
)
# "the day before the concert": a unit beside an event, not a date (`Asked.anchor`).
_ANCHOR = re.compile(
    rf"\b(?:the\s+)?(?:{_NUM}\s+)?(?:{_UNIT}|{_WEEKDAY})\s+(?P<side>before|after|prior to|following)\s+",
    re.IGNORECASE,
)
_OPEN = re.compile(r"\b(?P<open>since|after|from|before|until|till|prior to)\s+(?:the\s+)?$", re.IGNORECASE)
_ASKS_WHEN = re.compile(
    r"\b(?:when|what\s+(?:year|month|day|date|time|week|season)|which\s+(?:year|month|day|date|week|season)"
    r"|how\s+long|how\s+many\s+(?:years|months|weeks|days)|how\s+recently|how\s+soon|since\s+when)\b",
    re.IGNORECASE,
)
_FIRST = re.compile(
    r"\b(?:(?:the|their|his|her|my|your|our)\s+first|first\s+time|earliest|initially|originally|at\s+first)\b",
    re.IGNORECASE,
)
_LATEST = re.compile(
    r"\b(?:most\s+recent(?:ly)?|latest|(?:the|their|his|her|my|your|our)\s+last\s+(?!\d|(?:few|couple"
    r"|several|two|three|four|five|six|seven|eight|nine|ten|days?|weeks?|weekends?|months?|years?)\b)\w+"
    r"|last\s+time|lately)\b",
    re.IGNORECASE,
)
# A length of time or a time said loosely: "for 4 years", "since", "every week". A message
# that says one answers "how long" and "how often".
_LENGTH = re.sub(r"\(\?P<\w+>", "(?:", rf"{_NUM}\s+{_UNIT}")  # "4 years", unnamed groups
_DURATION = re.compile(
    rf"\b(?:for|over|about|almost|nearly|around)\s+{_LENGTH}|\b(?:since|ago|every|anniversary)\b"
    rf"|\b{_LENGTH}\s+(?:old|now|long)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Asked:
    """What a query says about time: the days it names, whether it asks for a time, in what order."""

    spans: tuple[Span, ...] = ()
    when: bool = False
    order: int = 0  # 1: the first time first; -1: the latest first; 0: no order asked
    # "the day before " when the query puts a unit beside an event ("the day before the concert"):
    # the days it names are those beside the day the event was spoken of (`anchored`).
    anchor: str = ""


def named_spans(query: str) -> list[Span]:
    """The explicit days and months the query names, in the order of the patterns; impossible dates
    (31 February) are skipped. A date is read once: its words are not read again as a month."""
    return [span for _, span in _explicit_matches(query)]


def spans_in(text: str, today: date) -> list[Span]:
    """Every day, month or range the text names, explicit or relative to `today`, in text order."""
    return [span for _, span in _found(text, today)]


def asked(query: str, today: date | None) -> Asked:
    """What the query asks about time; relative words are read only with a reference day."""
    spans = spans_in(query, today) if today else named_spans(query)
    order = 1 if _FIRST.search(query) else -1 if _LATEST.search(query) else 0
    return Asked(
        spans=tuple(spans), when=bool(_ASKS_WHEN.search(query)), order=order, anchor=_event_anchor(query)
    )


def _event_anchor(query: str) -> str:
    """The words "the day before " where an event follows them; none before a date ("the day
    before 3 May 2023" names a span)."""
    anchor = _ANCHOR.search(query)
    if anchor is None:
        return ""
    after = _found(query[anchor.end() : anchor.end() + 40], date(2000, 1, 1))
    return "" if after and after[0][0] == 0 else anchor.group(0)


def anchored(anchor: str, day: date) -> Span:
    """The days `anchor` ("the day before ") names beside `day`, the day its event was spoken of."""
    near = _BESIDE.search(anchor)
    return _shifted(near, (day, day + timedelta(days=1))) if near else (day, day + timedelta(days=1))


def told(text: str, said: date) -> tuple[Span, ...]:
    """The days a message said on `said` speaks of ("yesterday" is the day before). Not cached here:
    a cache of message texts would keep forgotten ones (`kenning.retrieval.turn_cache` keeps what
    is read from a dataset's turns, and drops it with them)."""
    return tuple(spans_in(text, said))


def timed(text: str) -> bool:
    """Whether a message says when or for how long: a date, a relative time or a length of time."""
    return bool(_DURATION.search(text) or _found(text, date(2000, 1, 1)))


def within(day: date, spans: Sequence[Span]) -> bool:
    return any(start <= day < end for start, end in spans)


def overlaps(spans: tuple[Span, ...] | list[Span], others: tuple[Span, ...] | list[Span]) -> bool:
    return any(
        start < other_end and other_start < end for start, end in spans for other_start, other_end in others
    )


def _found(text: str, today: date) -> list[tuple[int, Span]]:
    """(position, span) of every expression, explicit dates first; the words read, and those that
    turned them ("the week before"), are blanked so that no later pattern reads them again."""
    found: list[tuple[int, Span]] = []
    rest = text
    for match, span in _explicit_matches(text):
        rest = _read(rest, match.start(), match.end(), span, today, found)
    for pattern in _RELATIVE:
        for match in pattern.finditer(rest):
            relative = _relative(match, today)
            if relative is not None:
                rest = _read(rest, match.start(), match.end(), relative, today, found)
    return sorted(found, key=lambda pair: pair[0])


def _read(rest: str, start: int, end: int, span: Span, today: date, found: list[tuple[int, Span]]) -> str:
    """Note the span, as the words before it turn it, and blank what was read."""
    turned, start = _beside(rest, start, span, today)
    found.append((start, turned))
    return rest[:start] + " " * (end - start) + rest[end:]


def _explicit_matches(text: str) -> list[tuple[re.Match[str], Span]]:
    """Explicit dates; a date is read once: its words are not read again as a month."""
    found = []
    rest = text
    for pattern in _EXPLICIT:
        for match in pattern.finditer(rest):
            span = _explicit_span(match)
            if span is not None:
                found.append((match, span))
        rest = pattern.sub(lambda m: " " * len(m.group(0)), rest)
    return found


def _beside(text: str, start: int, span: Span, today: date) -> tuple[Span, int]:
    """The span as the words just before `start` turn it ("the week before X", "since X", "until
    X"), and where those words start."""
    before = text[max(0, start - 60) : start]
    near = _BESIDE.search(before)
    if near is not None:
        return _shifted(near, span), start - len(before) + near.start()
    opened = _OPEN.search(before)
    if opened is None:
        return span, start
    return _opened(opened.group("open"), span, today), start - len(before) + opened.start()


def _opened(word: str, span: Span, today: date) -> Span:
    """The range "since X", "after X", "before X" or "until X" names."""
    word = word.lower()
    if word in {"since", "from"}:
        return span[0], max(today + timedelta(days=1), span[1])
    if word == "after":
        return span[1], date.max
    if word in {"until", "till"}:
        return date.min, span[1]
    if word in {"before", "prior to", "by"}:
        return date.min, span[0]
    return span


def _shifted(near: re.Match[str], span: Span) -> Span:
    side = near.group("side").lower()
    count = _count(near.group("n")) if near.group("n") else 1
    if near.group("weekday"):
        wanted = _WEEKDAYS[near.group("weekday").lower()]
        if side in {"before", "prior to"}:
            day = span[0] - timedelta(days=(span[0].weekday() - wanted - 1) % 7 + 1)
        else:
            day = span[1] + timedelta(days=(wanted - span[1].weekday()) % 7)
        return day, day + timedelta(days=1)
    unit = near.group("unit").lower()
    if side == "of":
        return _unit_of(span[0], unit)
    length = _length(unit) * count
    if side in {"before", "prior to"}:
        return span[0] - length, span[0]
    return span[1], span[1] + length


def _relative(match: re.Match[str], today: date) -> Span | None:
    found = {key: value for key, value in match.groupdict().items() if value}
    if "word" in found:
        return _word(found["word"].lower(), today)
    if "ago" in found:
        return _ago(found, today)
    if "which" in found:
        return _which(found, today)
    if "season" in found:
        return _season(found["season"].lower(), int(found["year"]) if "year" in found else None, today)
    if "month" in found:
        name = found["month"]
        if name.casefold() in _WORDS_TOO and not name[0].isupper():
            return None
        return _opened(found["cue"], _nearest_month(_MONTHS[name.casefold()], today), today)
    if "year" in found:
        year = int(found["year"])
        return _opened(found["cue"], (date(year, 1, 1), date(year + 1, 1, 1)), today)
    if "weekday" in found:
        day = _weekday_before(today, _WEEKDAYS[found["weekday"].lower()])
        return day, day + timedelta(days=1)
    if "n" in found:  # "in the past 10 days"
        return today - _length(found["unit"].lower()) * _count(found["n"]), today + timedelta(days=1)
    return None


def _word(word: str, today: date) -> Span:
    offsets = {
        "the day before yesterday": -2, "yesterday": -1, "today": 0, "tonight": 0, "this morning": 0,
        "this afternoon": 0, "this evening": 0, "tomorrow": 1, "the day after tomorrow": 2,
    }  # fmt: skip
    if word in offsets:
        day = today + timedelta(days=offsets[word])
        return day, day + timedelta(days=1)
    return today - timedelta(days=14), today  # "the other day"


def _ago(found: dict[str, str], today: date) -> Span:
    unit, count = found["unit"].lower(), _count(found["n"])
    later = found["ago"].lower() in {"later", "from now"}
    if unit in {"month", "months"}:
        return _month_span(today, count if later else -count)
    if unit in {"year", "years"}:
        year = today.year + (count if later else -count)
        return date(year, 1, 1), date(year + 1, 1, 1)
    shift = _length(unit) * count
    return _unit_of(today + shift if later else today - shift, unit)


def _which(found: dict[str, str], today: date) -> Span:
    which = found["which"].lower()
    step = {"last": -1, "previous": -1, "past": -1, "this": 0, "next": 1, "coming": 1}[which]
    if "weekday" in found:
        wanted = _WEEKDAYS[found["weekday"].lower()]
        ahead = (wanted - today.weekday()) % 7 or (7 if step else 0)
        day = _weekday_before(today, wanted) if step < 0 else today + timedelta(days=ahead)
        return day, day + timedelta(days=1)
    if "season" in found:
        start = _season(found["season"].lower(), None, today)
        if step < 0 and start[0] > today - timedelta(days=90):
            return _season(found["season"].lower(), start[0].year - 1, today)
        return start
    unit = found["unit"].lower()
    if which == "past":  # "the past week": the days up to today
        return today - _length(unit), today + timedelta(days=1)
    if unit.startswith("month"):
        return _month_span(today, step)
    if unit.startswith("year"):
        return date(today.year + step, 1, 1), date(today.year + step + 1, 1, 1)
    return _unit_of(today + _length(unit) * step, unit)


def _unit_of(day: date, unit: str) -> Span:
    """The calendar day, week (Monday first), weekend, month or year holding `day`."""
    unit = unit.rstrip("s")
    if unit == "day":
        return day, day + timedelta(days=1)
    if unit in {"week", "fortnight"}:
        monday = day - timedelta(days=day.weekday())
        return monday, monday + timedelta(days=7 if unit == "week" else 14)
    if unit == "weekend":
        saturday = day + timedelta(days=5 - day.weekday())
        return saturday, saturday + timedelta(days=2)
    if unit == "month":
        return _month_span(day, 0)
    return date(day.year, 1, 1), date(day.year + 1, 1, 1)


def _length(unit: str) -> timedelta:
    unit = unit.rstrip("s")
    days = {"day": 1, "week": 7, "weekend": 7, "fortnight": 14, "month": 30, "year": 365}[unit]
    return timedelta(days=days)


def _month_span(day: date, step: int) -> Span:
    index = day.year * 12 + day.month - 1 + step
    start = date(index // 12, index % 12 + 1, 1)
    return start, date((index + 1) // 12, (index + 1) % 12 + 1, 1)


def _nearest_month(month: int, today: date) -> Span:
    """The month of that name whose start is nearest `today`: last June, or the coming one."""
    spans = [_month_span(date(year, month, 1), 0) for year in (today.year - 1, today.year, today.year + 1)]
    return min(spans, key=lambda span: abs((span[0] - today).days))


def _season(season: str, year: int | None, today: date) -> Span:
    """The season's three months (northern); winter starts in December of its year."""
    start = date(year if year is not None else today.year, _SEASONS[season], 1)
    return start, _month_span(start, 2)[1]


def _weekday_before(today: date, wanted: int) -> date:
    """The last such weekday before `today` (a week back when today is one)."""
    return today - timedelta(days=(today.weekday() - wanted - 1) % 7 + 1)


def _count(word: str) -> int:
    word = word.lower()
    return int(word) if word.isdigit() else _NUMBERS.get(word, 1)


def _explicit_span(match: re.Match[str]) -> Span | None:
    """The range of one explicit match; None for an impossible date, one past the calendar's end,
    or a month name in lower case that is also an everyday word."""
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
