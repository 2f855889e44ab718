"""The five ECL steps as plain functions over ports: classify, chunk, extract, load, fk-edges.

Each step reads its input from the stores by id and writes its output back, so a
step can run in any process, be retried, or be re-run, with the same result.
A step of the plan is given `fencing.fenced_services` (see `plan.Step.run`): a write of a
step whose run lost its dataset lock raises `LockLost` before it happens.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from contextvars import copy_context
from dataclasses import dataclass
from typing import Protocol

from kenning.pipeline import collection
from kenning.pipeline.assembly import (
    Assembly,
    IndexEntry,
    assemble,
    graph_edge,
    graph_node,
    index_entries,
    over_edge,
)
from kenning.pipeline.checks import REPLY_COUNTERS
from kenning.pipeline.chunking import chunk_text
from kenning.pipeline.context import Job, Services
from kenning.pipeline.contradiction import FACTS_RETIMED, judge_batch, judge_of
from kenning.pipeline.errors import InputError, LLMError, LLMUnreachable
from kenning.pipeline.forget import forget_superseded
from kenning.pipeline.linking import document_title
from kenning.pipeline.loaders import detect_kind, extract_rows, extract_text
from kenning.pipeline.models import (
    Chunk,
    ChunkRecord,
    ChunkStatus,
    DataItem,
    Document,
    DocumentRecord,
    GraphEdge,
    GraphNode,
    ItemStatus,
    VectorPoint,
    content_hash,
    extraction_key,
)
from kenning.pipeline.offline import OfflineExtractor
from kenning.pipeline.ports import chunked
from kenning.pipeline.progress import report
from kenning.pipeline.structured import Table, foreign_key_graph
from kenning.pipeline.temporal import document_time, moment
from kenning.pipeline.unit import attribute, chunk_ids_of, unit_budget, unit_item, unit_text, units_of
from kenning.pipeline.validity import PERIODS, FactRules, Periods, keyed_ends, put_periods, settle

log = logging.getLogger(__name__)

# Around each write of a load batch: lets one write of the dataset at a time through, where
# load parts run at once (a no-op where one writer does all the writes).
Writing = Callable[[], AbstractContextManager[object]]


class Claim(Protocol):
    """Takes chunks for the caller's load part: of those given, in order, the ones no other part
    of the run took first, at most `limit` (None: all of them)."""

    def __call__(self, ids: Sequence[str], limit: int | None = None) -> list[str]: ...


STRUCTURED_KINDS = frozenset({"csv", "json"})
# Documents chunked between two writes of their chunks (one transaction for their chunks, one
# for their items' statuses).
CHUNK_GROUP = 64


def classify(services: Services, job: Job) -> dict[str, int]:
    """Data items -> typed documents; unreadable items are marked failed with the reason."""
    items = services.metadata.list_items(job.dataset_id, ItemStatus.PENDING)
    documents: list[DocumentRecord] = []
    report("classify", 0, len(items))
    for done, item in enumerate(items, 1):
        try:
            documents.append(_classify_item(services, job, item))
        except InputError as error:
            services.metadata.set_item_status(item.id, ItemStatus.FAILED, str(error))
        report("classify", done, len(items))
    services.chunks.save_documents(documents)
    services.metadata.set_items_status([document.data_id for document in documents], ItemStatus.CLASSIFIED)
    structured = sum(1 for document in documents if document.kind in STRUCTURED_KINDS)
    return {
        "documents": len(documents),
        "failed_items": len(items) - len(documents),
        "structured": structured,
    }


def _classify_item(services: Services, job: Job, item: DataItem) -> DocumentRecord:
    limit = services.config.max_document_bytes
    if item.size > limit:
        raise InputError(f"{item.name}: {item.size} bytes is over the limit of {limit} bytes")
    data = services.blobs.get(item.content_hash)
    kind = detect_kind(item.name, data, limits=services.config.inputs)
    document = Document(
        name=item.name, kind=kind, data_id=item.id, mime=item.mime, tenant=job.tenant, dataset=job.dataset
    )
    return DocumentRecord(
        id=document.id, dataset_id=job.dataset_id, data_id=item.id, name=item.name, kind=kind, mime=item.mime
    )


def chunk(services: Services, job: Job) -> list[str]:
    """Documents -> chunks; returns the ids of every chunk still waiting for extraction."""
    items = {item.id: item for item in services.metadata.list_items(job.dataset_id, ItemStatus.CLASSIFIED)}
    documents = services.chunks.list_documents(job.dataset_id, list(items))
    report("chunk", 0, len(documents))
    records: list[ChunkRecord] = []
    cut: list[str] = []
    for done, document in enumerate(documents, 1):
        item = items[document.data_id]
        try:
            records += _chunk_document(services, job, item, document)
            cut.append(item.id)
        except InputError as error:
            services.metadata.set_item_status(item.id, ItemStatus.FAILED, str(error))
        if len(cut) == CHUNK_GROUP or done == len(documents):
            _save_chunks(services, records, cut)
            records, cut = [], []
        report("chunk", done, len(documents))
    pending = services.chunks.list_chunk_ids(job.dataset_id, ChunkStatus.PENDING)
    failed = services.chunks.list_chunk_ids(job.dataset_id, ChunkStatus.FAILED)
    extracted = services.chunks.list_chunk_ids(job.dataset_id, ChunkStatus.EXTRACTED)
    return pending + failed + _uncached(services, job, extracted)


def _save_chunks(services: Services, records: list[ChunkRecord], item_ids: list[str]) -> None:
    """The chunks of these items, then the items marked chunked: one transaction each."""
    if not item_ids:
        return
    services.chunks.save_chunks(records)
    services.metadata.set_items_status(item_ids, ItemStatus.CHUNKED)


def _uncached(services: Services, job: Job, chunk_ids: list[str]) -> list[str]:
    """The chunks, extracted but not loaded, whose extraction the cache no longer holds for
    this extractor (its prompt changed since, or the cache was cleared): extracted again."""
    if not chunk_ids:
        return []
    keys = _extraction_keys(services, job, services.chunks.get_chunks(chunk_ids))
    cached = set(services.cache.get_extractions(list(set(keys.values()))))
    return [chunk_id for chunk_id, key in keys.items() if key not in cached]


def _extraction_keys(services: Services, job: Job, records: Sequence[ChunkRecord]) -> dict[str, str]:
    model, version, tenant = services.extractor.model, services.extractor.prompt_version, job.scope.tenant
    return {r.id: extraction_key(tenant, model, version, r.text_hash) for r in records}


def _chunk_document(
    services: Services, job: Job, item: DataItem, document: DocumentRecord
) -> list[ChunkRecord]:
    # NUL characters survive some formats (JSON escapes, PDFs) and PostgreSQL text cannot hold them.
    blob = services.blobs.get(item.content_hash)
    text = extract_text(document.kind, blob, limits=services.config.inputs, name=item.name).replace(
        "\x00", ""
    )
    pieces = chunk_text(text, services.config.chunking)
    records = []
    for index, piece in enumerate(pieces):
        chunk_id = Chunk(
            text="",
            index=index,
            document_id=document.id,
            token_count=0,
            tenant=job.tenant,
            dataset=job.dataset,
        ).id
        records.append(
            ChunkRecord(
                id=chunk_id,
                dataset_id=job.dataset_id,
                document_id=document.id,
                data_id=item.id,
                index=index,
                text=piece.text,
                token_count=piece.token_count,
                text_hash=content_hash(piece.text.encode()),
            )
        )
    return records


def extraction_units(services: Services, job: Job, chunk_ids: Sequence[str]) -> list[str]:
    """The work items of the extract step: the extraction units that hold those chunks.

    A document's units are cut from all of its chunks, whatever their status, so a run that
    resumes cuts the same units as the run before it and finds their cached extractions. The
    offline extractor, which calls no LLM, reads one chunk at a time.
    """
    budget = unit_budget(services)
    if not budget or not chunk_ids:
        return list(chunk_ids)
    wanted = set(chunk_ids)
    data_ids = sorted({record.data_id for record in services.chunks.get_chunks(chunk_ids)})
    units = units_of(services.chunks.chunks_of(job.dataset_id, data_ids), budget)
    return [unit_item([r.id for r in unit]) for unit in units if wanted.intersection(r.id for r in unit)]


def extract(services: Services, job: Job, items: Sequence[str]) -> dict[str, int]:
    """Extraction units -> knowledge graph + summary for each of their chunks, through the cache.

    Each item is a unit (`unit.unit_item`; a plain chunk id is a unit of one chunk): its
    chunks are read in one extractor call, whose answer is split over them (`unit.attribute`)
    and cached under each chunk's key. A unit is sent only when one of its chunks not yet
    extracted has nothing cached; when its call fails, those chunks are marked failed with the
    error and the other units proceed. The tokens counted are those of the extractor's calls.
    """
    records = {record.id: record for record in services.chunks.get_chunks(chunk_ids_of(items))}
    extractor = services.extractor
    keys = _extraction_keys(services, job, list(records.values()))
    cached = set(services.cache.get_extractions(list(set(keys.values()))))
    units = [[records[i] for i in chunk_ids_of([item]) if i in records] for item in items]
    waiting = [[r for r in unit if r.status in _EXTRACTABLE or keys[r.id] not in cached] for unit in units]
    hits = [r.id for chunks in waiting if all(keys[r.id] in cached for r in chunks) for r in chunks]
    services.chunks.set_chunk_status(hits, ChunkStatus.EXTRACTED)
    spent: Counter[str] = Counter(cache_hits=sum(keys[r.id] in cached for chunks in waiting for r in chunks))
    done = set(cached)
    for unit, chunks in zip(units, waiting, strict=True):
        if all(keys[record.id] in cached for record in chunks):
            continue
        if any(keys[record.id] not in done for record in chunks):
            try:
                done |= _extract_unit(services, unit, keys, done, spent)
            except LLMError as error:
                spent["failed_chunks"] += len(chunks)
                spent["unreachable_chunks"] += len(chunks) if isinstance(error, LLMUnreachable) else 0
                services.chunks.set_chunk_status([r.id for r in chunks], ChunkStatus.FAILED, str(error))
                continue
        services.chunks.set_chunk_status([record.id for record in chunks], ChunkStatus.EXTRACTED)
    calls = spent["calls"]
    return {
        # The offline extractor is no LLM: its extractions are not LLM calls, and cost nothing.
        "extractions": calls,
        "llm_calls": 0 if extractor.model == OfflineExtractor.model else calls,
        "cache_hits": spent["cache_hits"],
        "failed_chunks": spent["failed_chunks"],
        "prompt_tokens": spent["prompt_tokens"],
        "completion_tokens": spent["completion_tokens"],
        # Only when the LLM's breaker failed some: `finish_run` then says so.
        **({"unreachable_chunks": spent["unreachable_chunks"]} if spent["unreachable_chunks"] else {}),
        # What getting usable replies took (repairs, splits), when it took any.
        **{name: spent[name] for name in REPLY_COUNTERS if spent[name]},
    }


def _extract_unit(
    services: Services, unit: list[ChunkRecord], keys: dict[str, str], done: set[str], spent: Counter[str]
) -> set[str]:
    """One extractor call for the unit; each chunk's share is cached. The keys it cached."""
    texts = [record.text for record in unit]
    spent["calls"] += 1
    extraction = services.extractor.extract(texts[0] if len(texts) == 1 else unit_text(texts))
    if extraction.usage is not None:
        spent["prompt_tokens"] += extraction.usage.prompt_tokens
        spent["completion_tokens"] += extraction.usage.completion_tokens
    spent.update(extraction.checks)
    shares = {
        keys[record.id]: share
        for record, share in zip(unit, attribute(extraction, texts), strict=True)
        if keys[record.id] not in done
    }
    # Kept at once: a worker killed later in the batch never pays for this call again.
    # Not fenced: the answer is the chunks' whoever asked, and a later run reuses it.
    services.cache.put_extractions(shares)
    return set(shares)


def ensure_collections(services: Services) -> None:
    """Create the vector collections load writes, where they are missing."""
    for name in collection.LOADED:
        services.vectors.ensure_collection(name, services.embedder.dimension)


_EXTRACTABLE = frozenset({ChunkStatus.PENDING, ChunkStatus.FAILED})
NO_EXTRACTION = (
    "no extraction of this chunk was found at load (the extractor changed since it was extracted, "
    "or the cache was cleared); the next cognify extracts it again"
)


def load(services: Services, job: Job, writing: Writing = nullcontext) -> dict[str, int]:
    """Extracted chunks -> graph (nodes, then edges) and vector points, batch by batch; the
    items superseded by newer versions forgotten first, and items whose chunks are all loaded done.

    Batches are pipelined: while one thread writes batch k to the stores, the caller's
    thread assembles and embeds batch k+1. Writes stay in batch order, and a batch's
    chunks are marked loaded only once it is written. Progress counts the chunks written.
    Each batch is written inside `writing()`: where load parts run at once (`load_part`), it
    holds the others' writes of the dataset off.
    """
    forgotten = forget_superseded(services, job)
    chunk_ids = services.chunks.list_chunk_ids(job.dataset_id, ChunkStatus.EXTRACTED)
    totals = _load_chunks(services, job, chunk_ids, writing)
    totals.update(superseded_items=len(forgotten.items))
    _mark_items_done(services, job)
    return dict(totals)


def load_part(
    services: Services,
    job: Job,
    items: Sequence[str],
    writing: Writing = nullcontext,
    claim: Claim | None = None,
) -> dict[str, int]:
    """Load the chunks of the extraction units `items` that are extracted, as `load` would, while
    the rest of the run is still extracted: the run's `load` then does what is left.

    Parts may run at once, on any workers: each writes its batches inside `writing()`, which
    must let one write of the dataset at a time through (a node or fact that several parts
    produce is merged with what is stored, a read then a write). Assembly and embeddings run
    outside it, in parallel.

    With `claim`, a part loads only the chunks no other part took first (that part loads them,
    or the run's `load` step, which loads every extracted chunk left, if it died), and takes
    extracted chunks of the run that no part has taken yet, up to a load batch: when the writes
    fall behind the extraction, each write carries more chunks, and the parts of those chunks
    find them taken."""
    records = services.chunks.get_chunks(chunk_ids_of(items))
    extracted = [record.id for record in records if record.status == ChunkStatus.EXTRACTED]
    taken = extracted if claim is None else _claimed(services, job, extracted, claim)
    totals = _load_chunks(services, job, taken, writing)
    totals.update(streamed_chunks=len(taken))
    return dict(totals)


def _claimed(services: Services, job: Job, own: list[str], claim: Claim) -> list[str]:
    """Of the part's own chunks, those no other part took; then extracted chunks of the run no
    part took, filling its load batch."""
    mine = claim(own)
    room = services.config.load_batch - len(mine)
    if room <= 0:
        return mine
    skip = set(own)
    extracted = services.chunks.list_chunk_ids(job.dataset_id, ChunkStatus.EXTRACTED)
    return mine + claim([chunk_id for chunk_id in extracted if chunk_id not in skip], room)


def _load_chunks(services: Services, job: Job, chunk_ids: list[str], writing: Writing) -> Counter[str]:
    totals: Counter[str] = Counter()
    if chunk_ids:
        ensure_collections(services)
    written = 0
    report("load", written, len(chunk_ids))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="load-writer") as writer:
        pending: tuple[Future[Counter[str]], int] | None = None
        for batch in chunked(chunk_ids, services.config.load_batch):
            assembly = _assemble_batch(services, job, batch)
            totals.update(assembly.checks)
            indexed = _embed(services, assembly)
            if pending is not None:
                totals.update(pending[0].result())
                written += pending[1]
                report("load", written, len(chunk_ids))
            # In this context: the writer thread reports and checks the fence as this one would.
            write = writer.submit(
                copy_context().run, _write_batch, services, job, batch, assembly, indexed, writing
            )
            pending = write, len(batch)
        if pending is not None:
            totals.update(pending[0].result())
            written += pending[1]
            report("load", written, len(chunk_ids))
    return totals


def _assemble_batch(services: Services, job: Job, chunk_ids: list[str]) -> Assembly:
    records = services.chunks.get_chunks(chunk_ids)
    documents = {
        d.id: d for d in services.chunks.list_documents(job.dataset_id, list({r.data_id for r in records}))
    }
    keys = _extraction_keys(services, job, records)
    extractions = services.cache.get_extractions(list(set(keys.values())))
    data_ids = [document.data_id for document in documents.values()]
    items = services.metadata.get_items(data_ids)
    hashes = {item.id: item.content_hash for item in items}
    node_sets = {item.id: item.node_sets for item in items}
    batch = [
        (r, documents[r.document_id], extractions[keys[r.id]]) for r in records if keys[r.id] in extractions
    ]
    firsts = _first_chunks(services, job, records)
    titles = {document_id: document_title(record.text) for document_id, record in firsts.items()}
    return assemble(
        job.run_id,
        job.scope,
        batch,
        hashes,
        temporal=services.config.temporal,
        node_sets=node_sets,
        titles=titles,
        entity_types=services.config.entity_types,
        times=_item_times(items, firsts),
    )


def _first_chunks(services: Services, job: Job, records: list[ChunkRecord]) -> dict[str, ChunkRecord]:
    """The first chunk of each document of the batch (maybe in another batch): where a document
    gives its title and its time."""
    firsts = {record.document_id: record for record in records if record.index == 0}
    missing = sorted({record.document_id for record in records} - set(firsts))
    ids = [_first_chunk_id(job, document_id) for document_id in missing]
    firsts.update({record.document_id: record for record in services.chunks.get_chunks(ids)})
    return firsts


def _item_times(items: Sequence[DataItem], firsts: dict[str, ChunkRecord]) -> dict[str, tuple[str, str]]:
    """Each item's (moment, time added): the moment its text gives for itself, else when it was
    added. Both come from the data, so a load done again gives its facts the same times."""
    stated = {record.data_id: document_time(record.text) for record in firsts.values()}
    times = {}
    for item in items:
        added = moment(item.created_at)
        times[item.id] = (stated.get(item.id) or added, added)
    return times


def _first_chunk_id(job: Job, document_id: str) -> str:
    return Chunk(
        text="", index=0, document_id=document_id, token_count=0, tenant=job.tenant, dataset=job.dataset
    ).id


@dataclass(frozen=True)
class Indexed:
    """A batch's index entries and one vector per distinct text among them."""

    entries: list[IndexEntry]
    vectors: dict[str, list[float]]


def _embed(services: Services, assembly: Assembly) -> Indexed:
    entries = index_entries(assembly)
    texts = list(dict.fromkeys(entry.text for entry in entries))
    return Indexed(entries, dict(zip(texts, services.embedder.embed(texts), strict=True)))


def _write_batch(
    services: Services, job: Job, chunk_ids: list[str], assembly: Assembly, indexed: Indexed, writing: Writing
) -> Counter[str]:
    """Write the batch and mark its chunks loaded; a chunk the assembly has no extraction for
    (the extractor changed since, or the cache was cleared) is failed, to be extracted again."""
    # Points that settling neither reads nor changes (chunks and their words, summaries,
    # entities, types) are written outside the dataset's one write at a time, which guards what
    # it reads and writes: nodes, facts and the facts' points. An entity's point that two
    # batches write is replaced whole by each, in whichever order they come, as under it.
    _write_vectors(services, job, indexed, facts=False)
    nodes, edges = _graph_of(assembly)
    with writing():
        counts = _write_settled(services, job, assembly, (nodes, edges), indexed)
    built = assembly.chunk_ids
    missing = [chunk_id for chunk_id in chunk_ids if chunk_id not in built]
    services.chunks.set_chunk_status([i for i in chunk_ids if i in built], ChunkStatus.LOADED)
    if missing:
        services.chunks.set_chunk_status(missing, ChunkStatus.FAILED, NO_EXTRACTION)
        counts["failed_chunks"] += len(missing)
    return counts


def _graph_of(assembly: Assembly) -> tuple[list[GraphNode], list[GraphEdge]]:
    """The assembly's nodes and facts as the graph store takes them (made outside the write lock:
    checking them is most of what upserting them costs here)."""
    nodes = [graph_node(node) for node in assembly.nodes.values()]
    edges = [graph_edge(edge, assembly.chunk_of[edge.id]) for edge in assembly.edges.values()]
    return nodes, edges


def _write(
    services: Services, job: Job, nodes: list[GraphNode], edges: list[GraphEdge], indexed: Indexed
) -> Counter[str]:
    services.graph.upsert_nodes(job.scope, nodes)
    services.graph.upsert_edges(job.scope, edges)
    _write_vectors(services, job, indexed, facts=True)
    return Counter(nodes=len(nodes), edges=len(edges), embeddings=len(indexed.vectors))


def _write_vectors(
    services: Services, job: Job, indexed: Indexed, facts: bool, periods: Periods | None = None
) -> None:
    """Write the batch's points of the fact collections, each with the `periods` settled for it
    (`facts`), or its points of every other collection and its chunks' words."""
    by_collection: dict[str, list[VectorPoint]] = {}
    entries, vectors, held = indexed.entries, indexed.vectors, periods or {}
    for entry in entries:
        if (entry.collection in collection.FACTS) != facts:
            continue
        payload = entry.payload
        if entry.point_id in held:
            payload = {**payload, PERIODS: held[entry.point_id]}
        # Unchecked: built from the batch's own fields; checking 384 floats costs more than writing them.
        point = VectorPoint.model_construct(id=entry.point_id, vector=vectors[entry.text], payload=payload)
        by_collection.setdefault(entry.collection, []).append(point)
    for name, points in by_collection.items():
        services.vectors.ensure_collection(name, services.embedder.dimension)
        services.vectors.upsert(job.scope, name, points)
    if not facts:
        chunk_texts = [(e.point_id, e.text, e.payload) for e in entries if e.collection == collection.CHUNKS]
        services.lexical.index(job.scope, chunk_texts)


def _write_settled(
    services: Services,
    job: Job,
    assembly: Assembly,
    graph: tuple[list[GraphNode], list[GraphEdge]],
    indexed: Indexed,
) -> Counter[str]:
    """Write the batch's nodes, then its edges, each fact once with when it held (a newer fact
    may end an older one: `kenning.pipeline.validity`) worked out with the stored facts it meets
    (rewritten where that changed them), then its facts' points; with an LLM
    judge, what it says of the batch's facts (`kenning.pipeline.contradiction`). Runs under the
    dataset's one write at a time, which so settles its facts."""
    nodes, edges = graph
    rules = services.config.facts
    judge = judge_of(services.extractor, rules)
    ends, whole = _ends_to_read(assembly, rules, judge is not None)
    services.graph.upsert_nodes(job.scope, nodes)
    settled = settle(services.graph, job.scope, ends, rules, whole, pending=edges, merge=over_edge)
    _write_vectors(services, job, indexed, facts=True, periods=settled.periods)
    batch = set(assembly.edges)
    put_periods(services.vectors, job.scope, settled, {edge.id for edge in settled.changed} - batch)
    counts = Counter(nodes=len(nodes), edges=len(edges), embeddings=len(indexed.vectors))
    counts[FACTS_RETIMED] = len(settled.changed)
    if judge is not None:
        counts.update(judge_batch(services.graph, services.vectors, job.scope, rules, ends, batch, judge))
    return counts


def _ends_to_read(assembly: Assembly, rules: FactRules, judged: bool) -> tuple[list[str], set[str] | None]:
    """The ends of the batch's facts, and those of them whose every fact settling reads (None:
    all of them)."""
    said = [edge for edge in assembly.edges.values() if edge.said]
    ends = sorted({end for edge in said for end in (edge.source_id, edge.target_id)})
    if judged:
        # A judge records which facts end which in the statements of the facts beside them:
        # with one, every fact of every end is read.
        return ends, None
    # By the rules alone, the ends the rules key are enough.
    facts = [(edge.source_id, edge.relationship, edge.target_id) for edge in said]
    return ends, keyed_ends(rules, facts, lambda node_id: _name_of(assembly, node_id))


def _name_of(assembly: Assembly, node_id: str) -> str:
    node = assembly.nodes.get(node_id)
    return str(getattr(node, "name", "") or "") if node is not None else ""


OPEN_CHUNKS = (ChunkStatus.PENDING, ChunkStatus.EXTRACTED, ChunkStatus.FAILED)


def _mark_items_done(services: Services, job: Job) -> None:
    """Items whose chunks are all loaded are done; failed chunks keep theirs open for a retry."""
    chunked_items = services.metadata.list_items(job.dataset_id, ItemStatus.CHUNKED)
    if not chunked_items:
        return
    unfinished = services.chunks.data_ids_with_chunks(job.dataset_id, OPEN_CHUNKS)
    services.metadata.set_items_status(
        [item.id for item in chunked_items if item.id not in unfinished], ItemStatus.DONE
    )


def fk_edges(services: Services, job: Job, structured: int) -> dict[str, int]:
    """CSV/JSON rows -> records linked by deterministic foreign-key edges, no LLM call."""
    if not structured:
        return {}
    documents = [d for d in services.chunks.list_documents(job.dataset_id) if d.kind in STRUCTURED_KINDS]
    items = {item.id: item for item in services.metadata.get_items([d.data_id for d in documents])}
    tables = []
    for document in documents:
        item = items[document.data_id]
        if item.status == ItemStatus.FAILED:
            continue
        try:
            blob = services.blobs.get(item.content_hash)
            rows = extract_rows(document.kind, blob, limits=services.config.inputs, name=item.name) or []
        except InputError as error:
            log.warning("no rows from %s: %s", item.name, error)
            continue
        tables.append(Table(name=_table_name(item.name), data_id=item.id, rows=rows))
    records, edges = foreign_key_graph(tables, job.tenant, job.dataset, services.config.references)
    assembly = Assembly()
    for record in records:
        assembly.add_node(record, "")
    for edge in edges:
        assembly.add_edge(edge, "")
    indexed = _embed(services, assembly)
    _write_vectors(services, job, indexed, facts=False)
    return dict(_write(services, job, *_graph_of(assembly), indexed))


def _table_name(name: str) -> str:
    stem = name.rsplit("/", 1)[-1]
    return stem.rsplit(".", 1)[0] if "." in stem else stem
