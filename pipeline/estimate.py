"""What cognify would spend, before spending it: LLM calls and tokens, from the pending work.

Nothing is written: pending items are read and chunked in memory, and chunks whose
extraction is already cached (or already extracted) are not counted. With an LLM, a call
reads an extraction unit: consecutive chunks of one document (`unit`).
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from kenning.pipeline.chunking import chunk_text, group_units
from kenning.pipeline.context import Services
from kenning.pipeline.errors import InputError
from kenning.pipeline.loaders import detect_kind, extract_text
from kenning.pipeline.models import ChunkStatus, ItemStatus, Scope, content_hash, extraction_key
from kenning.pipeline.unit import unit_budget, unit_text, units_of

# Measured against the LLM simulator (which bills four characters a token and answers with
# the offline extractor's graph) on SciFact abstracts and 2Wiki paragraphs, refitted when the
# extractor stopped linking every pair of names in a sentence (20 documents each: SciFact
# 7,232 chunk tokens, 466 names, 12,736 completion tokens; 2Wiki 1,710, 398, 15,917).
# The prompt is the chunk plus the system prompt and the chunk's wrapper; a provider that
# also bills the response schema adds about 400 tokens a call. The answer grows with the
# names a chunk mentions (each becomes a node with a description) far more than with its
# length; text whose headers and markup are capitalized (reStructuredText) is overestimated.
PROMPT_OVERHEAD_TOKENS = 300
COMPLETION_PER_CHUNK_TOKEN = 0.05
COMPLETION_PER_NAME_TOKENS = 31
_NAME = re.compile(r"\b[A-Z][\w'-]*")


class Estimate(BaseModel):
    dataset: str
    items: int = 0
    unreadable_items: int = 0
    chunks: int = 0
    cached_chunks: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def price(self, per_1k_prompt: float, per_1k_completion: float) -> Estimate:
        cost = price(self.prompt_tokens, self.completion_tokens, per_1k_prompt, per_1k_completion)
        return self.model_copy(update={"cost": cost})


def price(
    prompt_tokens: int, completion_tokens: int, per_1k_prompt: float, per_1k_completion: float
) -> float:
    """What the tokens cost at those prices per 1000 tokens, rounded to 6 decimals."""
    return round(prompt_tokens / 1000 * per_1k_prompt + completion_tokens / 1000 * per_1k_completion, 6)


def estimate(services: Services, scope: Scope) -> Estimate:
    """LLM calls and tokens the next cognify of `scope` would spend (offline extraction costs none)."""
    result = Estimate(dataset=scope.dataset)
    dataset = services.metadata.get_dataset(scope)
    if dataset is None:
        return result
    units = _pending_units(services, dataset.id, result)
    extractor = services.extractor
    keys = [
        [
            extraction_key(scope.tenant, extractor.model, extractor.prompt_version, content_hash(t.encode()))
            for t in unit
        ]
        for unit in units
    ]
    cached = services.cache.get_extractions(sorted({key for unit in keys for key in unit}))
    result.cached_chunks = sum(1 for unit in keys for key in unit if key in cached)
    # A unit is read in one call unless all its chunks are cached; identical units are read once.
    fresh = list(
        {
            tuple(unit_keys): unit_text(unit)
            for unit_keys, unit in zip(keys, units, strict=True)
            if any(key not in cached for key in unit_keys)
        }.values()
    )
    if extractor.model == "offline":
        return result
    result.llm_calls = len(fresh)
    chunk_tokens = sum(len(text) // 4 for text in fresh)
    result.prompt_tokens = chunk_tokens + PROMPT_OVERHEAD_TOKENS * len(fresh)
    names = sum(len(_NAME.findall(text)) for text in fresh)
    result.completion_tokens = (
        int(chunk_tokens * COMPLETION_PER_CHUNK_TOKEN) + COMPLETION_PER_NAME_TOKENS * names
    )
    return result


def _pending_units(services: Services, dataset_id: str, result: Estimate) -> list[list[str]]:
    """Texts of the chunks the next run would extract, unit by unit (`unit.units_of`): new items
    chunked here, plus the units of stored chunks waiting."""
    budget = unit_budget(services)
    units: list[list[str]] = []
    items = services.metadata.list_items(dataset_id, ItemStatus.PENDING)
    for item in items + services.metadata.list_items(dataset_id, ItemStatus.CLASSIFIED):
        result.items += 1
        try:
            data = services.blobs.get(item.content_hash)
            if item.size > services.config.max_document_bytes:
                raise InputError("over the size limit")
            text = extract_text(detect_kind(item.name, data), data)
        except InputError:
            result.unreadable_items += 1
            continue
        pieces = chunk_text(text, services.config.chunking)
        groups = group_units([piece.token_count for piece in pieces], budget)
        units += [[pieces[index].text for index in group] for group in groups]
    waiting = services.chunks.list_chunk_ids(dataset_id, ChunkStatus.PENDING)
    waiting += services.chunks.list_chunk_ids(dataset_id, ChunkStatus.FAILED)
    records = services.chunks.get_chunks(waiting)
    data_ids = sorted({record.data_id for record in records})
    stored = units_of(services.chunks.chunks_of(dataset_id, data_ids), budget) if data_ids else []
    open_ids = set(waiting)
    result.chunks = sum(len(unit) for unit in units) + len(waiting)
    units += [[r.text for r in unit] for unit in stored if any(r.id in open_ids for r in unit)]
    return units
