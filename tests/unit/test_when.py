"""The days and months a query names, read as date ranges."""

from __future__ import annotations

from datetime import date

import pytest

from kenning.retrieval.when import named_spans, within


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        ("What did Gina find on 1 February, 2023?", date(2023, 2, 1), date(2023, 2, 2)),
        ("What did she paint on October 13, 2023?", date(2023, 10, 13), date(2023, 10, 14)),
        ("Who called on the 3rd of Sept 2022?", date(2022, 9, 3), date(2022, 9, 4)),
        ("What happened in June 2023?", date(2023, 6, 1), date(2023, 7, 1)),
        ("Plans for December, 2023?", date(2023, 12, 1), date(2024, 1, 1)),
        ("Notes from 2023-05-08", date(2023, 5, 8), date(2023, 5, 9)),
        ("Said at 2023-05-08T13:56", date(2023, 5, 8), date(2023, 5, 9)),
        ("What did we plan in May 2024?", date(2024, 5, 1), date(2024, 6, 1)),
    ],
)
def test_a_named_day_or_month_is_one_range(query: str, start: date, end: date) -> None:
    assert named_spans(query) == [(start, end)]


def test_a_day_is_not_read_again_as_its_month() -> None:
    assert named_spans("on 13 October 2023 and in May 2024") == [
        (date(2023, 10, 13), date(2023, 10, 14)),
        (date(2024, 5, 1), date(2024, 6, 1)),
    ]


@pytest.mark.parametrize(
    "query",
    [
        "What did Ben do last week?",
        "Who was born in 1990?",
        "on 31 February, 2023",
        "May I ask?",
        "you may 2023 times",
        "we march 2000 people",
        "valid until 9999-12-31",
        "valid until 31 December 9999",
        "valid until December 9999",
    ],
)
def test_no_explicit_possible_date_names_nothing_and_nothing_fails(query: str) -> None:
    assert named_spans(query) == []


def test_within_is_half_open() -> None:
    spans = named_spans("in June 2023")
    assert within(date(2023, 6, 30), spans) and not within(date(2023, 7, 1), spans)
    assert not within(date(2023, 6, 30), [])
