"""Every completion type's context says when each fact it gives held, in one rendering
(`kenning.pipeline.validity.fact_line`): the period holding now, or the one covering `as_of`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

# Oslo, then Berlin, then Oslo again: the Oslo fact held twice.
MESSAGES = [
    "[2023-01-10T09:00:00] Ana: I live in Oslo and work for Norsk Data.",
    "[2024-06-02T10:00:00] Ana: We moved to Berlin last month; I joined Zalando.",
    "[2025-02-01T10:00:00] Ana: I live in Oslo again.",
]
# The completion types whose contexts give facts; no LLM: each gives its context alone.
FACT_TYPES = [
    "GRAPH_COMPLETION",
    "TRIPLET_COMPLETION",
    "HYBRID_COMPLETION",
    "GRAPH_SUMMARY_COMPLETION",
    "GRAPH_COMPLETION_COT",
    "GRAPH_COMPLETION_CONTEXT_EXTENSION",
    "GRAPH_COMPLETION_DECOMPOSITION",
    "AGENTIC_COMPLETION",
    "CONVERSATION",
]


@pytest.fixture(scope="module")
def kenning(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kenning]:
    home: Path = tmp_path_factory.mktemp("contexts") / "home"
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        for message in MESSAGES:
            memory.remember(message, "ana")
        yield memory


def context(kenning: Kenning, kind: str, as_of: str | None = None) -> str:
    found = kenning.search("Where does Ana live?", kind, datasets=["ana"], only_context=True, as_of=as_of)
    return found.context


@pytest.mark.parametrize("kind", FACT_TYPES)
def test_a_context_says_since_when_a_fact_holds(kenning: Kenning, kind: str) -> None:
    now = context(kenning, kind)
    assert "Oslo (since 2025-02-01)" in now, now
    assert "Berlin (" not in now, now  # (chunks are given as they were said: only facts have times)


@pytest.mark.parametrize("kind", FACT_TYPES)
def test_as_of_a_moment_a_context_gives_the_period_covering_it(kenning: Kenning, kind: str) -> None:
    then = context(kenning, kind, as_of="2023-06")
    assert "Oslo (2023-01-10 to 2024-05)" in then, then
    assert "since 2025" not in then and "Berlin (" not in then, then
    between = context(kenning, kind, as_of="2024-09")
    assert "Berlin (2024-05 to 2025-02-01)" in between, between
