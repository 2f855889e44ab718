"""CODING_RULES and node sets: data added into a node set, searched by that set alone, on twins."""

from __future__ import annotations

import pytest

from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import Scope
from kenning.retrieval.contract import SearchRequest, SearchResult, SearchType
from kenning.retrieval.registry import search
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import TwinServices

PROJECT = Scope(tenant="t1", dataset="project")
OTHER = Scope(tenant="t1", dataset="other")
RULES = {
    "typing.md": "Always annotate public functions with precise type hints.",
    "errors.md": "Never catch a bare exception; translate driver errors at the storage boundary.",
}
STYLE = {"naming.md": "Name functions with verb phrases and modules with singular nouns."}
NOTES = {"notes.txt": "Always annotate public functions? The team discussed type hints at lunch."}
FOREIGN = {"foreign.md": "Always annotate public functions in the other project with docstrings."}


def sources(corpus: dict[str, str], node_sets: list[str]) -> list[Source]:
    return [
        Source(name=name, uri=f"test:{name}", data=text.encode(), node_sets=node_sets)
        for name, text in corpus.items()
    ]


@pytest.fixture(scope="module")
def memory() -> TwinServices:
    services = TwinServices()
    add(services.metadata, services.blobs, PROJECT, sources(RULES, ["coding_agent_rules"]))
    add(services.metadata, services.blobs, PROJECT, sources(STYLE, ["style_guide"]))
    add(services.metadata, services.blobs, PROJECT, sources(NOTES, []))
    add(services.metadata, services.blobs, OTHER, sources(FOREIGN, ["coding_agent_rules"]))
    runner = LocalRunner(services, services.lock)
    assert runner.run(PROJECT).status.value == "completed"
    assert runner.run(OTHER).status.value == "completed"
    return services


def run(services: TwinServices, query: str, only_context: bool = True, **options: object) -> SearchResult:
    request = SearchRequest(
        query=query,
        type=SearchType.CODING_RULES,
        scopes=[PROJECT],
        only_context=only_context,
        options=options,
    )
    return search(services, request)


def test_the_node_set_is_stored_on_the_item_and_its_data_points(memory: TwinServices) -> None:
    dataset = memory.metadata.get_dataset(PROJECT)
    assert dataset is not None
    sets = {item.name: item.node_sets for item in memory.metadata.list_items(dataset.id)}
    assert sets == {
        "typing.md": ["coding_agent_rules"],
        "errors.md": ["coding_agent_rules"],
        "naming.md": ["style_guide"],
        "notes.txt": [],
    }
    query = memory.embedder.embed(["type hints"])[0]
    points = memory.vectors.search(PROJECT, "DocumentChunk_text", query, 10)
    by_text = {point.payload["text"]: point.payload["node_sets"] for point in points}
    assert by_text[RULES["typing.md"]] == ["coding_agent_rules"] and by_text[NOTES["notes.txt"]] == []


def test_rules_come_back_closest_first_as_a_bullet_list(memory: TwinServices) -> None:
    # When the rules are searched with the text of one of them
    result = run(memory, RULES["typing.md"])
    # Then every rule of the set comes back, that one first, and nothing else
    assert [hit.text for hit in result.results] == [RULES["typing.md"], RULES["errors.md"]]
    assert all(hit.kind == "rule" and hit.chunk_id and hit.data_id for hit in result.results)
    assert result.context == f"- {RULES['typing.md']}\n- {RULES['errors.md']}"


def test_documents_outside_the_set_never_come_back(memory: TwinServices) -> None:
    # Given a note that is nearly the query, added with no node set
    result = run(memory, NOTES["notes.txt"], top_k=50)
    # Then it is not among the rules, nor is another set's document
    texts = {hit.text for hit in result.results}
    assert texts == set(RULES.values())
    assert "lunch" not in result.context and "verb phrases" not in result.context


def test_the_node_set_option_selects_another_set(memory: TwinServices) -> None:
    result = run(memory, "naming", node_set="style_guide")
    assert [hit.text for hit in result.results] == [STYLE["naming.md"]]
    assert run(memory, "naming", node_set="no_such_set").results == []


def test_another_datasets_rules_never_come_back(memory: TwinServices) -> None:
    result = run(memory, FOREIGN["foreign.md"], top_k=50)
    assert all(hit.dataset == "project" for hit in result.results)
    assert "other project" not in result.context


def test_offline_the_answer_is_none_with_a_notice(memory: TwinServices) -> None:
    result = run(memory, "How should I handle errors?", only_context=False)
    assert result.results and result.context
    assert result.answer is None and result.notice and "LLM" in result.notice
