"""A search option (Python's `options=`) of the wrong kind or out of range is the caller's error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kenning.pipeline.errors import InputError
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

BAD = [
    ("GRAPH_COMPLETION", {"passages": "many"}, "passages"),
    ("GRAPH_COMPLETION", {"top_edges": 0}, "top_edges"),
    ("GRAPH_PPR", {"damping": 5}, "damping"),
    ("HYBRID_COMPLETION", {"damping": "high"}, "damping"),
    ("GRAPH_COMPLETION_COT", {"rounds": "two"}, "rounds"),
    ("AGENTIC_COMPLETION", {"steps": 2.5}, "steps"),
]


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory) -> Any:
    home: Path = tmp_path_factory.mktemp("options") / "home"
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        memory.add_text("Ada Lovelace wrote notes on the Analytical Engine.", "notes")
        memory.cognify("notes")
        yield memory


@pytest.mark.parametrize(("kind", "options", "named"), BAD)
def test_a_bad_search_option_is_the_callers_error(
    memory: Kenning, kind: str, options: dict[str, Any], named: str
) -> None:
    # When a search is asked with an option of the wrong kind or out of its range, then it is an
    # InputError naming the option (not a ValueError or a validation error from deep inside)
    with pytest.raises(InputError, match=named):
        memory.search("What did Ada write?", kind, datasets=["notes"], only_context=True, options=options)


def test_good_options_still_shape_the_search(memory: Kenning) -> None:
    def ask(**options: Any) -> list[Any]:
        question = "What did Ada write?"
        found = memory.search(question, "GRAPH_COMPLETION", datasets=["notes"], options=options)
        return found.results

    assert (facts_only := ask(passages=0)) and all(hit.kind == "edge" for hit in facts_only)
    with_text = ask()
    assert with_text[0].kind == "chunk" and "Analytical Engine" in with_text[0].text
