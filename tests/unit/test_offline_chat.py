"""The offline extractor on remembered messages: names only, and relations that state facts."""

from __future__ import annotations

import pytest

from kenning.pipeline.offline import OfflineExtractor

SAID = "[2024-02-12T18:30:00]"


def names(text: str) -> set[str]:
    return {node.name for node in OfflineExtractor().extract(text).graph.nodes}


def facts(text: str) -> set[tuple[str, str, str]]:
    graph = OfflineExtractor().extract(text).graph
    return {(edge.source, edge.relationship, edge.target) for edge in graph.edges}


@pytest.mark.parametrize(
    "words",
    [
        "Wow, that's a lovely garden!",
        "Yeah, I'm not sure yet.",
        "Thanks so much, it means a lot.",
        "Hey! How have you been lately?",
        "Oh no, that sounds rough.",
        "It's fine, we'll manage.",
        "Did you keep the ticket R2-77?",
    ],
)
def test_interjections_pronouns_question_words_and_ids_name_nothing(words: str) -> None:
    assert names(f"{SAID} Noor: {words}") == {"Noor"}


def test_a_greeting_in_front_of_a_name_is_cut_off() -> None:
    assert names(f"{SAID} Noor: Hey Tobias! Thanks Priya for the lift.") == {"Noor", "Tobias", "Priya"}


def test_the_speaker_is_i_and_a_relation_needs_a_verb() -> None:
    found = facts(f"{SAID} Noor: Oh, I visited Lisbon with Marta in spring.")
    assert ("noor", "visited", "lisbon") in found
    assert not any(relationship in {"with", "in"} for _, relationship, _ in found)


def test_a_question_states_no_fact() -> None:
    assert facts(f"{SAID} Noor: Have you visited Lisbon with Marta?") == set()


def test_a_document_is_read_as_before() -> None:
    text = "Grace Hopper worked at Remington Rand. She built the first compiler in 1952."
    assert {"Grace Hopper", "Remington Rand"} <= names(text)
