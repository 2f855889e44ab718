"""Time in a question or a message read against a reference day: relative days, open ranges,
"when" and "how long" questions, and the first or latest time. Phrasings are written for these
tests (none comes from an evaluation set)."""

from __future__ import annotations

from datetime import date

import pytest

from kenning.retrieval.when import anchored, asked, spans_in, timed, told

# A Thursday: the last day a memory was spoken on, against which a question is read.
TODAY = date(2024, 3, 14)


@pytest.mark.parametrize(
    ("question", "start", "end"),
    [
        ("What did Noor bake yesterday?", date(2024, 3, 13), date(2024, 3, 14)),
        ("Which film did Ilse see the day before yesterday?", date(2024, 3, 12), date(2024, 3, 13)),
        ("What did Tariq repair last week?", date(2024, 3, 4), date(2024, 3, 11)),
        ("Where did the team hike three weeks ago?", date(2024, 2, 19), date(2024, 2, 26)),
        ("What did Wen plant two months ago?", date(2024, 1, 1), date(2024, 2, 1)),
        ("Who visited a couple of months back?", date(2024, 1, 1), date(2024, 2, 1)),
        ("What did Ola sell last month?", date(2024, 2, 1), date(2024, 3, 1)),
        ("What happened last year at the lake?", date(2023, 1, 1), date(2024, 1, 1)),
        ("Which book did Pia start last Saturday?", date(2024, 3, 9), date(2024, 3, 10)),
        ("What did Ravi cook on Monday?", date(2024, 3, 11), date(2024, 3, 12)),
        ("What is planned for next Tuesday?", date(2024, 3, 19), date(2024, 3, 20)),
        ("What did Joss fix last weekend?", date(2024, 3, 9), date(2024, 3, 11)),
        ("Whom did Ada call in the past 10 days?", date(2024, 3, 4), date(2024, 3, 15)),
        ("What did Lio paint in the summer of 2022?", date(2022, 6, 1), date(2022, 9, 1)),
        ("Where did Mirela travel in October?", date(2023, 10, 1), date(2023, 11, 1)),
        ("What did they agree the week of 4 September 2023?", date(2023, 9, 4), date(2023, 9, 11)),
        ("What did Bo buy the Tuesday before 20 June 2023?", date(2023, 6, 13), date(2023, 6, 14)),
        ("Where was Kai the day after 1 April 2023?", date(2023, 4, 2), date(2023, 4, 3)),
    ],
)
def test_a_relative_time_in_a_question_is_one_range_against_the_reference_day(
    question: str, start: date, end: date
) -> None:
    assert asked(question, TODAY).spans == ((start, end),)


@pytest.mark.parametrize(
    ("question", "start", "end"),
    [
        ("What has Femi read since February 2024?", date(2024, 2, 1), date(2024, 3, 15)),
        ("What has Uma grown since 2021?", date(2021, 1, 1), date(2024, 3, 15)),
        ("What did Iris learn after 9 March 2024?", date(2024, 3, 10), date.max),
        ("What did Hal build before 2020?", date.min, date(2020, 1, 1)),
        ("What did Cy owe until last Monday?", date.min, date(2024, 3, 12)),
    ],
)
def test_since_after_before_and_until_open_a_range(question: str, start: date, end: date) -> None:
    assert asked(question, TODAY).spans == ((start, end),)


def test_without_a_reference_day_only_explicit_dates_are_read() -> None:
    assert asked("What did Noor bake yesterday?", None).spans == ()
    assert asked("What did Noor bake on 2 March 2024?", None).spans == ((date(2024, 3, 2), date(2024, 3, 3)),)


@pytest.mark.parametrize(
    "question",
    [
        "When did Gus move to Lisbon?",
        "What year did Sade open the bakery?",
        "Which month was the recital?",
        "How long has Petra played the cello?",
        "How many weeks ago did Omar quit?",
        "Since when does Zia keep bees?",
    ],
)
def test_a_question_asking_for_a_time_says_so(question: str) -> None:
    assert asked(question, TODAY).when


@pytest.mark.parametrize(
    "question",
    ["What did Gus bring to Lisbon?", "Who plays the cello?", "May I see the menu?", "Did they march?"],
)
def test_a_question_that_asks_no_time_names_none(question: str) -> None:
    found = asked(question, TODAY)
    assert not found.when and found.spans == () and found.order == 0


@pytest.mark.parametrize(
    ("question", "order"),
    [
        ("What did Ines order the first time they met?", 1),
        ("Where was their earliest trip?", 1),
        ("Which café did Ruth pick most recently?", -1),
        ("What did Abe say the last time he called?", -1),
        ("What was his latest hobby?", -1),
        ("What did Abe do in the last two weeks?", 0),
    ],
)
def test_first_and_latest_are_an_order(question: str, order: int) -> None:
    assert asked(question, TODAY).order == order


def test_a_message_speaks_of_days_relative_to_when_it_was_said() -> None:
    said = date(2023, 5, 8)  # a Monday
    found = told("We flew kites yesterday and went rowing last Friday.", said)
    assert found == ((date(2023, 5, 7), date(2023, 5, 8)), (date(2023, 5, 5), date(2023, 5, 6)))
    assert told("Lovely to hear from you!", said) == ()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("I have been knitting for six years now.", True),
        ("We met in 2019 at the harbour.", True),
        ("The parcel came three days ago.", True),
        ("That sounds wonderful, tell me more!", False),
        ("I love the colours in this one.", False),
    ],
)
def test_a_message_that_says_a_time_or_a_length_of_time_is_timed(text: str, says: bool) -> None:
    assert timed(text) is says


def test_an_impossible_date_and_a_date_past_the_calendar_read_as_nothing() -> None:
    assert spans_in("on 30 February 2023, or until 31 December 9999", TODAY) == []


@pytest.mark.parametrize(
    ("question", "start", "end"),
    [
        ("What did Uli cook the day before the recital?", date(2023, 6, 9), date(2023, 6, 10)),
        ("Where did Dee go the week after her move?", date(2023, 6, 11), date(2023, 6, 18)),
        ("What did Cy eat two days after the race?", date(2023, 6, 11), date(2023, 6, 13)),
    ],
)
def test_a_unit_beside_an_event_is_read_beside_the_day_of_the_event(
    question: str, start: date, end: date
) -> None:
    found = asked(question, TODAY)
    assert found.spans == () and anchored(found.anchor, date(2023, 6, 10)) == (start, end)


@pytest.mark.parametrize(
    "question", ["What did Uli cook the day before yesterday?", "the day before 3 May 2023"]
)
def test_a_unit_beside_a_date_is_no_event(question: str) -> None:
    assert asked(question, TODAY).anchor == ""
