"""What a pipeline task is given: its services (ports) and its job (ids only)."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from kenning.pipeline.checks import DEFAULT_ENTITY_TYPES
from kenning.pipeline.chunking import ChunkingConfig
from kenning.pipeline.lexical import LexicalIndex
from kenning.pipeline.loaders import InputLimits
from kenning.pipeline.models import Scope
from kenning.pipeline.ports import (
    BlobStore,
    ChunkStore,
    Embedder,
    ExtractionCache,
    Extractor,
    GraphStore,
    MetadataStore,
    VectorStore,
)
from kenning.pipeline.validity import FactRules


class PipelineConfig(BaseModel):
    """Batch sizes and limits of the ECL steps."""

    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    extract_batch: int = Field(default=8, ge=1, description="Chunks per extraction task")
    load_batch: int = Field(default=32, ge=1, description="Chunks written per load batch")
    max_document_bytes: int = Field(default=64 * 2**20, ge=1)
    inputs: InputLimits = Field(default_factory=InputLimits, description="How far one item may expand")
    temporal: bool = Field(default=False, description="Also extract dated events into Event/Timestamp nodes")
    references: dict[str, str] = Field(
        default_factory=dict,
        description="Foreign-key columns whose names say no table: `column` or `table.column` -> table",
    )
    entity_types: tuple[str, ...] = Field(
        default=DEFAULT_ENTITY_TYPES, description="The entity types the graph keeps; others are mapped"
    )
    facts: FactRules = Field(
        default_factory=FactRules, description="Relations of one value at a time, and their other names"
    )


class Services(Protocol):
    """The ports a task may use; the wiring opens each one lazily, on first use."""

    @property
    def config(self) -> PipelineConfig: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def chunks(self) -> ChunkStore: ...
    @property
    def cache(self) -> ExtractionCache: ...
    @property
    def blobs(self) -> BlobStore: ...
    @property
    def graph(self) -> GraphStore: ...
    @property
    def vectors(self) -> VectorStore: ...
    @property
    def lexical(self) -> LexicalIndex: ...
    @property
    def embedder(self) -> Embedder: ...
    @property
    def extractor(self) -> Extractor: ...


class Job(BaseModel):
    """The ids a pipeline step needs: this is what a task message carries."""

    run_id: str
    dataset_id: str
    tenant: str
    dataset: str

    @property
    def scope(self) -> Scope:
        return Scope(tenant=self.tenant, dataset=self.dataset)
