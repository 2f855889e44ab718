"""Extraction units: a long document's chunks read by the LLM a unit at a time, provenance per chunk."""

from __future__ import annotations

import math

from kenning.pipeline import tasks
from kenning.pipeline.chunking import ChunkingConfig, group_units
from kenning.pipeline.context import PipelineConfig
from kenning.pipeline.ingest import Source, add
from kenning.pipeline.models import (
    ChunkRecord,
    ChunkStatus,
    Extraction,
    KnowledgeEdge,
    KnowledgeGraph,
    KnowledgeNode,
    Scope,
    extraction_key,
)
from kenning.pipeline.plan import STEPS, start_run
from kenning.pipeline.unit import attribute, chunk_ids_of, unit_text
from kenning.retrieval.contract import SearchRequest, SearchType
from kenning.retrieval.registry import search
from kenning.workers.runtime.local_runner import LocalRunner
from tests.twins import CountingExtractor, TwinServices

SCOPE = Scope(tenant="t1", dataset="long")
BUDGET = 1500


class CountingLLM(CountingExtractor):
    """The counting twin under an LLM's name: its calls are LLM calls, read a unit at a time."""

    model = "counting-llm"

    def __init__(self, fail_on: str | None = None) -> None:
        super().__init__(fail_on)
        self.texts: list[str] = []

    def extract(self, text: str) -> Extraction:
        self.texts.append(text)
        return super().extract(text)


def long_text(paragraphs: int = 100, keeper: str = "Ivo") -> str:
    """Paragraphs of distinct names: `Keeper Ivo<n>` guards `Tower Elda<n>` in each one."""
    return "\n\n".join(
        f"Keeper {keeper}{n} guarded Tower Elda{n} for many years. "
        f"Keeper {keeper}{n} wrote to Captain Rask{n} about the storms of the northern coast. "
        f"Captain Rask{n} sailed from Port Velm{n} with supplies for the tower every month. "
        f"The ships of Port Velm{n} carried lamp oil, bread and letters to the keepers."
        for n in range(paragraphs)
    )


def services_with(extractor: CountingExtractor) -> TwinServices:
    config = PipelineConfig(chunking=ChunkingConfig(unit_tokens=BUDGET))
    return TwinServices(config=config, extractor=extractor)  # type: ignore[arg-type]


def add_texts(services: TwinServices, texts: dict[str, str], scope: Scope = SCOPE) -> None:
    sources = [Source(name=name, uri=f"test:{name}", data=text.encode()) for name, text in texts.items()]
    add(services.metadata, services.blobs, scope, sources)


def cognify(services: TwinServices, scope: Scope = SCOPE) -> dict[str, int]:
    return LocalRunner(services, services.lock, concurrency=3).run(scope).stats


def chunk_records(services: TwinServices, scope: Scope = SCOPE) -> list[ChunkRecord]:
    dataset = services.metadata.get_dataset(scope)
    assert dataset is not None
    records = services.chunks.get_chunks(services.chunks.list_chunk_ids(dataset.id))
    return sorted(records, key=lambda record: (record.document_id, record.index))


def test_units_are_consecutive_chunks_within_the_budget() -> None:
    # Given the token counts of 30 chunks of a long document
    counts = [250, 180, 240, 256, 90] * 6
    # When they are grouped under a 1,500-token budget
    units = group_units(counts, BUDGET)
    # Then the units cover every chunk once, in order, each within the budget
    assert [index for unit in units for index in unit] == list(range(len(counts)))
    assert all(sum(counts[index] for index in unit) <= BUDGET for unit in units)
    # And there are about as few of them as the tokens allow
    assert math.ceil(sum(counts) / BUDGET) <= len(units) <= math.ceil(sum(counts) / BUDGET) + 1
    # And a chunk over the budget is a unit of its own, and a budget of 0 keeps one chunk a unit
    assert group_units([2000, 100, 100], BUDGET) == [range(0, 1), range(1, 3)]
    assert group_units([100, 100], 0) == [range(0, 1), range(1, 2)]


def test_a_long_document_costs_a_call_per_unit_and_a_short_one_a_single_call() -> None:
    # Given a long document and a short one, and an LLM extractor
    llm = CountingLLM()
    services = services_with(llm)
    short = "Grace Hopper built the first compiler at Remington Rand in 1952."
    add_texts(services, {"long.txt": long_text(), "short.txt": short})

    # When the dataset is cognified
    stats = cognify(services)

    # Then the long document took about ceil(tokens / budget) calls, not one per chunk
    records = chunk_records(services)
    by_document: dict[str, list[ChunkRecord]] = {}
    for record in records:
        by_document.setdefault(record.document_id, []).append(record)
    long_chunks = max(by_document.values(), key=len)
    tokens = sum(record.token_count for record in long_chunks)
    assert len(long_chunks) >= 20
    assert math.ceil(tokens / BUDGET) <= llm.calls - 1 <= math.ceil(tokens / BUDGET) + 1
    assert stats["llm_calls"] == llm.calls and stats["chunks_to_extract"] == len(records)
    # And the short document was read as it is today: its one chunk's text, alone
    assert short in llm.texts
    # And every chunk was loaded, with its own share of its unit's extraction cached
    assert {record.status for record in records} == {ChunkStatus.LOADED}
    keys = [
        extraction_key(SCOPE.tenant, llm.model, llm.prompt_version, record.text_hash) for record in records
    ]
    assert set(keys) <= set(services.cache.get_extractions(keys))


def test_each_fact_is_attributed_to_the_chunk_that_mentions_it() -> None:
    # Given a long document cognified a unit at a time
    services = services_with(CountingLLM())
    add_texts(services, {"long.txt": long_text()})
    cognify(services)

    # When the graph's facts between entities are read back
    texts = {record.id: record.text.casefold() for record in chunk_records(services)}
    nodes, edges = services.graph.export(SCOPE)
    names = {
        node.id: str(node.properties.get("name", "")).casefold() for node in nodes if node.type == "Entity"
    }
    facts = [edge for edge in edges if edge.source_id in names and edge.target_id in names]

    # Then each one's chunk is a chunk that mentions both of its entities
    assert len(facts) > 40
    for edge in facts:
        text = texts[str(edge.properties["chunk_id"])]
        assert names[edge.source_id] in text and names[edge.target_id] in text, edge
    # And facts come from many chunks, not from the first chunk of each unit only
    assert len({edge.properties["chunk_id"] for edge in facts}) == len(texts)


def test_attribution_splits_a_unit_extraction_over_its_chunks() -> None:
    # Given a unit of two chunks and its extraction
    first = "Ada Lovelace met Charles Babbage in London."
    second = "Charles Babbage designed the Analytical Engine. Mary Somerville was a friend."
    graph = KnowledgeGraph(
        nodes=[
            KnowledgeNode(id="ada", name="Ada Lovelace", type="Person"),
            KnowledgeNode(id="babbage", name="Charles Babbage", type="Person"),
            KnowledgeNode(id="engine", name="Analytical Engine", type="Concept"),
            KnowledgeNode(id="somerville", name="Mary Somerville", type="Person"),
            KnowledgeNode(id="era", name="Victorian era", type="Concept"),
        ],
        edges=[
            KnowledgeEdge(source="babbage", target="engine", relationship="designed"),
            KnowledgeEdge(source="ada", target="babbage", relationship="met"),
            KnowledgeEdge(source="ada", target="somerville", relationship="knew"),
        ],
    )
    extraction = Extraction(graph=graph, summary="Lovelace and Babbage.")

    # When it is attributed to the chunks
    shares = attribute(extraction, [first, second])

    # Then each fact goes to the chunk mentioning both ends, else one of them, with its entities
    relations = [[edge.relationship for edge in share.graph.edges] for share in shares]
    assert relations == [["met", "knew"], ["designed"]]
    named = [{node.id for node in share.graph.nodes} for share in shares]
    assert named[1] == {"babbage", "engine", "somerville"}
    # And what no chunk mentions, and the summary, go to the first chunk
    assert named[0] == {"ada", "babbage", "somerville", "era"}
    assert [share.summary for share in shares] == ["Lovelace and Babbage.", ""]


def test_unit_text_drops_the_overlap_a_chunk_repeats() -> None:
    first = "The lamp was lit at dusk. The keeper climbed the stairs slowly."
    second = "The keeper climbed the stairs slowly. Then the storm came."
    assert unit_text([first, second]) == first + "\n\n" + "Then the storm came."
    assert unit_text(["One short text.", "Another text."]) == "One short text.\n\nAnother text."


def test_a_rerun_makes_no_new_llm_call() -> None:
    # Given a long document cognified once
    llm = CountingLLM()
    services = services_with(llm)
    add_texts(services, {"long.txt": long_text()})
    cognify(services)
    calls = llm.calls

    # When it is cognified again, and added to a second dataset and cognified there
    again = cognify(services)
    other = Scope(tenant="t1", dataset="copy")
    add_texts(services, {"long.txt": long_text()}, other)
    copied = cognify(services, other)

    # Then no call is made: the second dataset finds every chunk's share in the cache
    assert llm.calls == calls
    assert again.get("chunks_to_extract", 0) == 0
    assert copied["cache_hits"] == copied["chunks_to_extract"] == len(chunk_records(services, other))
    assert snapshot_facts(services, SCOPE) == snapshot_facts(services, other)


def snapshot_facts(services: TwinServices, scope: Scope) -> set[tuple[str, str, str]]:
    nodes, edges = services.graph.export(scope)
    names = {node.id: str(node.properties.get("name")) for node in nodes if node.type == "Entity"}
    return {
        (names[edge.source_id], edge.relationship, names[edge.target_id])
        for edge in edges
        if edge.source_id in names and edge.target_id in names
    }


def test_a_killed_run_resumes_with_the_units_it_had_not_extracted() -> None:
    # Given a run killed after extracting two of its units
    llm = CountingLLM()
    services = services_with(llm)
    add_texts(services, {"long.txt": long_text(), "other.txt": long_text(30, keeper="Oda")})
    job = start_run(services, SCOPE)
    STEPS["classify"].run(services, job, [])
    units = STEPS["chunk"].run(services, job, []).items
    assert len(units) > 4 and all(len(chunk_ids_of([unit])) > 1 for unit in units)
    STEPS["extract"].run(services, job, units[:2])
    assert llm.calls == 2

    # When a new run resumes the dataset
    stats = cognify(services)

    # Then it extracts only the units the killed run had not, each once, and loads every chunk
    assert llm.calls == len(units) and stats["llm_calls"] == len(units) - 2
    assert {record.status for record in chunk_records(services)} == {ChunkStatus.LOADED}


def test_a_failed_unit_fails_its_chunks_and_a_retry_extracts_it_alone() -> None:
    # Given an LLM that refuses the unit holding one paragraph of a long document
    llm = CountingLLM(fail_on="Captain Rask17 ")
    services = services_with(llm)
    add_texts(services, {"long.txt": long_text()})

    # When it is cognified
    stats = cognify(services)

    # Then the chunks of that unit failed, and only they
    failed = [r for r in chunk_records(services) if r.status == ChunkStatus.FAILED]
    assert failed and stats["failed_chunks"] == len(failed)
    assert any("Captain Rask17 " in record.text for record in failed)
    assert [r.index for r in failed] == list(range(failed[0].index, failed[0].index + len(failed)))

    # And a retry, once the LLM accepts it, makes that unit's call alone
    llm.fail_on = None
    calls = llm.calls
    retried = cognify(services)
    assert llm.calls == calls + 1 and retried["chunks_to_extract"] == len(failed)
    assert {record.status for record in chunk_records(services)} == {ChunkStatus.LOADED}


def test_extract_batches_never_split_a_unit() -> None:
    # Given a long document chunked by the plan
    services = services_with(CountingLLM())
    add_texts(services, {"long.txt": long_text()})
    job = start_run(services, SCOPE)
    STEPS["classify"].run(services, job, [])
    units = STEPS["chunk"].run(services, job, []).items

    # Then each work item is a whole unit: consecutive chunks, every chunk in exactly one item
    records = {record.id: record for record in chunk_records(services)}
    ids = chunk_ids_of(units)
    assert sorted(ids) == sorted(records) and len(ids) == len(set(ids))
    for unit in units:
        indexes = [records[chunk_id].index for chunk_id in chunk_ids_of([unit])]
        assert indexes == list(range(indexes[0], indexes[0] + len(indexes)))
        assert sum(records[chunk_id].token_count for chunk_id in chunk_ids_of([unit])) <= BUDGET


def test_the_offline_extractor_reads_one_chunk_a_call() -> None:
    # Given the offline extractor, which calls no LLM
    services = TwinServices()
    add_texts(services, {"long.txt": long_text()})
    # When a long document is cognified
    stats = cognify(services)
    # Then each chunk is extracted alone, as before units
    assert services.extractor.calls == stats["chunks_to_extract"] == len(chunk_records(services))
    assert tasks.extraction_units(services, start_run(services, SCOPE), ["a", "b"]) == ["a", "b"]


def test_graph_context_names_the_document_title_and_chunk_of_each_triplet() -> None:
    # Given a long document with a header and a short titled paragraph, cognified a unit at a time
    services = services_with(CountingLLM())
    header = "PEP: 9999\nTitle: Lighthouse Keeping Guidelines\nAuthor: Keeper Ivo0\n\n"
    lloyd = "Lloyd (film)\n\nLloyd is a 2001 film directed by Hector Barron in Mexico City."
    add_texts(services, {"pep-9999.rst": header + long_text(), "lloyd.txt": lloyd})
    cognify(services)
    labels = {
        "pep-9999.rst": "pep-9999.rst: Lighthouse Keeping Guidelines",
        "lloyd.txt": "lloyd.txt: Lloyd (film)",
    }
    names = {
        document.id: document.name
        for document in services.chunks.list_documents(chunk_records(services)[0].dataset_id)
    }
    chunks = {record.id: record for record in chunk_records(services)}

    # When the graph context of a question about a late paragraph of the long document is built
    query = "Who did Keeper Ivo87 write to about Tower Elda87?"
    request = SearchRequest(
        query=query,
        type=SearchType.GRAPH_COMPLETION,
        scopes=[SCOPE],
        only_context=True,
        options={"passages": 0},
    )
    result = search(services, request)

    # Then every triplet line ends with its document's name and title, and the chunk it came from
    lines = result.context.splitlines()
    assert len(lines) == len(result.results) > 0
    sources = []
    for line, hit in zip(lines, result.results, strict=True):
        chunk = chunks[str(hit.chunk_id)]
        assert line == f"{hit.text} [{labels[names[chunk.document_id]]}, chunk {chunk.index}]"
        sources.append((names[chunk.document_id], chunk.index))
    # And the best triplet comes from the late chunk that mentions the paragraph, titled by the first
    assert sources[0][0] == "pep-9999.rst" and sources[0][1] > 10
    assert "Ivo87" in chunks[str(result.results[0].chunk_id)].text
