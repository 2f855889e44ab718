"""Extraction units: consecutive chunks of one document that the extractor reads in one call.

Chunks are sized for the embedder, units for the LLM (`chunking.group_units`). A unit's
extraction is split back over its chunks, so provenance stays chunk-level: an entity
goes to every chunk that mentions it; a fact to the first chunk that mentions both its
ends, else one of them, else the unit's first chunk, with the entities it links; the
summary to the first chunk; anything mentioned nowhere to the first chunk. Each share is
what the load step reads for its chunk, under the chunk's own cache key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from kenning.pipeline.chunking import group_units
from kenning.pipeline.context import Services
from kenning.pipeline.models import ChunkRecord, Extraction, KnowledgeGraph, normalize_name
from kenning.pipeline.offline import OfflineExtractor

# Chunk ids are UUID strings: this never occurs in one.
SEPARATOR = "+"
# The overlap a chunk repeats from the one before it is at least a short sentence.
_MIN_OVERLAP_CHARS = 16
_MAX_OVERLAP_CHARS = 4000


def unit_budget(services: Services) -> int:
    """Tokens a unit holds at most; 0 (a chunk a unit) for the offline extractor, which calls no LLM."""
    return 0 if services.extractor.model == OfflineExtractor.model else services.config.chunking.unit_tokens


def units_of(chunks: Sequence[ChunkRecord], budget: int) -> list[list[ChunkRecord]]:
    """Whole documents' chunks grouped into units, document by document, in chunk order."""
    documents: dict[str, list[ChunkRecord]] = {}
    for record in chunks:
        documents.setdefault(record.document_id, []).append(record)
    units: list[list[ChunkRecord]] = []
    for records in documents.values():
        records.sort(key=lambda record: record.index)
        units += [
            [records[index] for index in group]
            for group in group_units([r.token_count for r in records], budget)
        ]
    return units


def unit_item(chunk_ids: Sequence[str]) -> str:
    """The work item of a unit: its chunk ids in order, in one string."""
    return SEPARATOR.join(chunk_ids)


def chunk_ids_of(items: Sequence[str]) -> list[str]:
    """The chunk ids of unit items (a plain chunk id is a unit of one), in order."""
    return [chunk_id for item in items for chunk_id in item.split(SEPARATOR) if chunk_id]


def unit_text(texts: Sequence[str]) -> str:
    """The chunks' texts joined, each without the overlap it repeats from the one before."""
    parts: list[str] = []
    for index, text in enumerate(texts):
        start = overlap(texts[index - 1], text) if index else 0
        part = text[start:].strip()
        if part:
            parts.append(part)
    return "\n\n".join(parts)


def overlap(previous: str, following: str) -> int:
    """How many leading characters of `following` end `previous` too (whole words), or 0."""
    if len(following) < _MIN_OVERLAP_CHARS:
        return 0
    head = following[:_MIN_OVERLAP_CHARS]
    window = max(0, len(previous) - _MAX_OVERLAP_CHARS)
    start = previous.find(head, window)
    while start != -1:
        size = len(previous) - start
        if following.startswith(previous[start:]) and (size == len(following) or following[size].isspace()):
            return size
        start = previous.find(head, start + 1)
    return 0


def attribute(extraction: Extraction, texts: Sequence[str]) -> list[Extraction]:
    """The unit's extraction split over its chunks' `texts`: one share per chunk, in order."""
    if len(texts) <= 1:
        return [extraction.model_copy(update={"usage": None})]
    nodes = extraction.graph.nodes
    haystacks = [_searchable(text) for text in texts]
    where = [_mentioned_in(haystacks, node.name.strip() or node.id.strip()) for node in nodes]
    find = _resolver(extraction.graph)
    shares: list[set[int]] = [set() for _ in texts]
    edges: list[list[int]] = [[] for _ in texts]
    for position, edge in enumerate(extraction.graph.edges):
        ends = [end for end in (find(edge.source), find(edge.target)) if end is not None]
        chunk = _chunk_of_fact([where[end] for end in ends])
        edges[chunk].append(position)
        shares[chunk].update(ends)
    for position, chunks in enumerate(where):
        for chunk in chunks:
            shares[chunk].add(position)
    placed = set().union(*shares)
    shares[0].update(position for position in range(len(nodes)) if position not in placed)
    return [
        Extraction(
            graph=KnowledgeGraph(
                nodes=[nodes[position] for position in sorted(shares[chunk])],
                edges=[extraction.graph.edges[position] for position in edges[chunk]],
            ),
            summary=extraction.summary if chunk == 0 else "",
        )
        for chunk in range(len(texts))
    ]


def _searchable(text: str) -> str:
    return " ".join(text.split()).casefold()


def _mentioned_in(haystacks: list[str], name: str) -> list[int]:
    needle = _searchable(name)
    if not needle:
        return []
    pattern = re.compile(r"(?<!\w)" + re.escape(needle) + r"(?!\w)")
    return [index for index, haystack in enumerate(haystacks) if pattern.search(haystack)]


def _resolver(graph: KnowledgeGraph) -> Callable[[str], int | None]:
    """Node positions by id, then by normalised name: how the assembly resolves a fact's ends."""
    by_id: dict[str, int] = {}
    by_name: dict[str, int] = {}
    for position, node in enumerate(graph.nodes):
        by_id[node.id] = position
        by_name.setdefault(normalize_name(node.name.strip() or node.id.strip()), position)

    def find(reference: str) -> int | None:
        found = by_id.get(reference)
        return found if found is not None else by_name.get(normalize_name(reference))

    return find


def _chunk_of_fact(ends: list[list[int]]) -> int:
    """The first chunk mentioning both ends of a fact, else one of them, else the first chunk."""
    if len(ends) == 2:
        both = sorted(set(ends[0]) & set(ends[1]))
        if both:
            return both[0]
    either = sorted({chunk for chunks in ends for chunk in chunks})
    return either[0] if either else 0
