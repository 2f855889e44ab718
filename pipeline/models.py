"""Domain model: the data points the pipeline produces and the records it keeps."""

from __future__ import annotations

import enum
import hashlib
import re
import uuid
from datetime import UTC, datetime
from typing import Any, ClassVar, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

NAMESPACE = uuid.UUID("6f1e4c1a-9a5e-4d2b-8a3c-4b656e6e696e")
DEFAULT_TENANT = "default"
DEFAULT_DATASET = "main"


def stable_id(*parts: str) -> str:
    """A UUID5 string derived from the parts: same parts, same id, in any process."""
    return str(uuid.uuid5(NAMESPACE, "\x1f".join(parts)))


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_SPACES = re.compile(r"\s+")


def normalize_name(name: str) -> str:
    """The identity form of a name: case-folded, single-spaced, stripped."""
    return _SPACES.sub(" ", name).strip().casefold()


# The weight of a node nobody rated: improve moves it with feedback, retrieval leans on it.
NEUTRAL_WEIGHT = 0.5


def utcnow() -> datetime:
    return datetime.now(UTC)


class Scope(BaseModel):
    """Every store call is scoped to one tenant and one dataset."""

    model_config = ConfigDict(frozen=True)

    tenant: str = DEFAULT_TENANT
    dataset: str = DEFAULT_DATASET

    @property
    def key(self) -> str:
        return f"{self.tenant}/{self.dataset}"


class Provenance(BaseModel):
    """Which data item, run and task last wrote a data point."""

    data_id: str
    content_hash: str = ""
    run_id: str = ""
    task: str = ""
    # The chunk it was read from, when it was: of several, the smallest id is kept (see assembly).
    chunk_id: str = ""


class DataPoint(BaseModel):
    """Base of every graph node: deterministic id, times, provenance, scope, node sets."""

    identity: ClassVar[tuple[str, ...]] = ()
    index_fields: ClassVar[tuple[str, ...]] = ()
    structural: ClassVar[tuple[str, ...]] = (
        "id",
        "tenant",
        "dataset",
        "created_at",
        "updated_at",
        "source",
        "data_ids",
        "node_sets",
    )

    id: str = ""
    tenant: str = DEFAULT_TENANT
    dataset: str = DEFAULT_DATASET
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    source: Provenance | None = None
    data_ids: list[str] = Field(default_factory=list)
    node_sets: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _assign_id(self) -> DataPoint:
        if not self.id:
            parts = [normalize_name(str(getattr(self, name))) for name in self.identity]
            self.id = stable_id(self.tenant, self.dataset, self.type_name(), *parts)
        if self.source and self.source.data_id not in self.data_ids:
            self.data_ids.append(self.source.data_id)
        return self

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__

    @property
    def scope(self) -> Scope:
        return Scope(tenant=self.tenant, dataset=self.dataset)

    def properties(self) -> dict[str, Any]:
        """The node's own fields as flat values a graph store can hold."""
        values = self.model_dump(exclude={"id", "tenant", "dataset", "source", "data_ids"}, mode="json")
        if self.source:
            values.update(
                source_data_id=self.source.data_id,
                source_hash=self.source.content_hash,
                source_run=self.source.run_id,
                source_task=self.source.task,
            )
            if self.source.chunk_id:
                values["source_chunk"] = self.source.chunk_id
        return values


class Document(DataPoint):
    identity = ("data_id",)

    name: str
    kind: str
    data_id: str
    mime: str = "text/plain"


class Chunk(DataPoint):
    identity = ("document_id", "index")
    index_fields = ("text",)

    text: str
    index: int
    document_id: str
    token_count: int

    @classmethod
    def type_name(cls) -> str:
        return "DocumentChunk"


class EntityType(DataPoint):
    identity = ("name",)
    index_fields = ("name",)

    name: str
    description: str = ""


class Entity(DataPoint):
    identity = ("name",)
    index_fields = ("name",)

    name: str
    entity_type: str = ""
    description: str = ""


class TextSummary(DataPoint):
    identity = ("chunk_id",)
    index_fields = ("text",)

    text: str
    chunk_id: str


class Edge(BaseModel):
    """A relationship between two nodes; `description` is one sentence about it."""

    index_fields: ClassVar[tuple[str, ...]] = ("description",)

    id: str = ""
    tenant: str = DEFAULT_TENANT
    dataset: str = DEFAULT_DATASET
    source_id: str
    target_id: str
    relationship: str
    description: str = ""
    data_ids: list[str] = Field(default_factory=list)
    # The statements of the fact, with when each says it began (`kenning.pipeline.validity`).
    said: list[dict[str, str]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _assign_id(self) -> Edge:
        if not self.id:
            self.id = stable_id(
                self.tenant, self.dataset, "Edge", self.source_id, self.relationship, self.target_id
            )
        return self


# The schema the LLM (or the offline extractor) fills for one chunk.


class KnowledgeNode(BaseModel):
    id: str = Field(description="A short key for the node, unique within this graph")
    name: str
    type: str = Field(description="The entity type, e.g. Person, Organization, Place, Date")
    description: str = ""


class KnowledgeEdge(BaseModel):
    source: str = Field(description="The id of the source node")
    target: str = Field(description="The id of the target node")
    relationship: str = Field(description="A snake_case relation name")
    description: str = Field(default="", description="One sentence stating the fact")


class KnowledgeGraph(BaseModel):
    nodes: list[KnowledgeNode] = Field(default_factory=list)
    edges: list[KnowledgeEdge] = Field(default_factory=list)


class TokenUsage(BaseModel):
    """The tokens an LLM call was billed for."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


class Extraction(BaseModel):
    """What extraction produces for one chunk: its graph and a short summary.

    `usage` is what producing it cost, and `checks` what getting a usable reply took (repairs,
    splits: `kenning.pipeline.checks`); they are neither cached nor part of the answer's schema.
    """

    graph: KnowledgeGraph
    summary: str
    usage: SkipJsonSchema[TokenUsage | None] = Field(default=None, exclude=True)
    checks: SkipJsonSchema[dict[str, int]] = Field(default_factory=dict, exclude=True)

    def __eq__(self, other: object) -> bool:
        # What it cost is not what it says: equal graph and summary are the same extraction.
        if not isinstance(other, Extraction):
            return NotImplemented
        return self.graph == other.graph and self.summary == other.summary


# Records kept in the metadata store.


def extraction_key(tenant: str, model: str, prompt_version: str, text_hash: str) -> str:
    """The extraction cache key of a chunk text for one tenant, model and prompt version: kept per
    tenant, so that a hit tells no tenant which texts another holds. The tenant is hashed, so the
    key cannot be read two ways whatever the tenant's name holds."""
    tenant_hash = hashlib.sha256(tenant.encode()).hexdigest()[:32]
    return f"{tenant_hash}|{model}|{prompt_version}|{text_hash}"


class Dataset(BaseModel):
    id: str
    tenant: str
    name: str
    created_at: datetime = Field(default_factory=utcnow)

    @property
    def scope(self) -> Scope:
        return Scope(tenant=self.tenant, dataset=self.name)

    @classmethod
    def of(cls, scope: Scope) -> Dataset:
        return cls(id=stable_id(scope.tenant, scope.dataset), tenant=scope.tenant, name=scope.dataset)


class ItemStatus(enum.StrEnum):
    PENDING = "pending"
    CLASSIFIED = "classified"
    CHUNKED = "chunked"
    DONE = "done"
    FAILED = "failed"
    # A newer version of the same source was added; the next cognify forgets this one.
    SUPERSEDED = "superseded"


class DataItem(BaseModel):
    """One added piece of data: a file, a text, an object from a bucket."""

    id: str
    dataset_id: str
    name: str
    source: str
    content_hash: str
    size: int
    mime: str = ""
    version: str = ""
    node_sets: list[str] = Field(default_factory=list)
    status: ItemStatus = ItemStatus.PENDING
    error: str = ""
    created_at: datetime = Field(default_factory=utcnow)

    @classmethod
    def of(
        cls, dataset: Dataset, name: str, source: str, data: bytes, mime: str = "", version: str = ""
    ) -> DataItem:
        digest = content_hash(data)
        return cls(
            id=stable_id(dataset.id, digest),
            dataset_id=dataset.id,
            name=name,
            source=source,
            content_hash=digest,
            size=len(data),
            mime=mime,
            version=version,
        )


class RunStatus(enum.StrEnum):
    INITIATED = "initiated"
    STARTED = "started"
    COMPLETED = "completed"
    # Done, but some items or chunks failed: `error` says how many, status lists each with its reason.
    COMPLETED_WITH_ERRORS = "completed_with_errors"
    ERRORED = "errored"
    # Its process ended before it did (killed, lost); the next cognify resumes its work.
    INTERRUPTED = "interrupted"
    # An operator ended it (`kenning runs cancel`); `error` says why. A retry resumes its work.
    CANCELLED = "cancelled"


RUNNING = frozenset({RunStatus.INITIATED, RunStatus.STARTED})
"""A run in these states may still be working."""
ENDED = frozenset(set(RunStatus) - RUNNING)
"""A run in these states is over, one way or another."""


EMBEDDED = "embedded"
"""A run of the embedded runner: one process runs every step (`kenning.workers.runtime.local_runner`)."""
DISTRIBUTED = "distributed"
"""A run of the Celery workers: its tasks hold leases, and the broker holds its messages."""


class PipelineRun(BaseModel):
    id: str
    dataset_id: str
    status: RunStatus = RunStatus.INITIATED
    # Which runner runs it (`EMBEDDED` or `DISTRIBUTED`), from its first write; "" in runs
    # recorded before runs had a mode.
    mode: str = ""
    step: str = ""
    error: str = ""
    stats: dict[str, int] = Field(default_factory=dict)
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None

    @property
    def embedded(self) -> bool:
        """Whether one process runs it (the embedded runner), not the Celery workers. A run recorded
        before runs had a mode tells it by the process id the embedded runner wrote."""
        return self.mode == EMBEDDED or (not self.mode and "embedded_pid" in self.stats)


class ChunkStatus(enum.StrEnum):
    PENDING = "pending"
    EXTRACTED = "extracted"
    LOADED = "loaded"
    FAILED = "failed"


class ChunkRecord(BaseModel):
    """A chunk as the metadata store keeps it between steps."""

    id: str
    dataset_id: str
    document_id: str
    data_id: str
    index: int
    text: str
    token_count: int
    text_hash: str
    status: ChunkStatus = ChunkStatus.PENDING
    error: str = ""


class DocumentRecord(BaseModel):
    id: str
    dataset_id: str
    data_id: str
    name: str
    kind: str
    mime: str = ""


# What the graph and vector stores hold.


class GraphNode(BaseModel):
    id: str
    type: str
    properties: dict[str, Any] = Field(default_factory=dict)
    data_ids: list[str] = Field(default_factory=list)


class GraphEdge(BaseModel):
    id: str
    source_id: str
    target_id: str
    relationship: str
    properties: dict[str, Any] = Field(default_factory=dict)
    data_ids: list[str] = Field(default_factory=list)


class EdgeShape(NamedTuple):
    """An edge's id, endpoints and relationship alone: what a walk over the graph reads.
    Made per read: a held graph shape keeps plain tuples, which the garbage collector stops
    tracking (it keeps tracking these, as it does every tuple subclass)."""

    id: str
    source_id: str
    target_id: str
    relationship: str


class Removal(BaseModel):
    """What taking data items' support away from a graph did."""

    deleted_nodes: list[str] = Field(default_factory=list)
    deleted_edges: list[str] = Field(default_factory=list)
    kept: dict[str, list[str]] = Field(
        default_factory=dict, description="nodes and edges still supported: id -> remaining data ids"
    )

    @property
    def deleted(self) -> list[str]:
        return [*self.deleted_nodes, *self.deleted_edges]


class VectorPoint(BaseModel):
    id: str
    vector: list[float]
    payload: dict[str, Any] = Field(default_factory=dict)


class ScoredPoint(BaseModel):
    """A search hit; `score` is a distance (lower is closer), in [0, 2] for cosine."""

    id: str
    score: float
    payload: dict[str, Any] = Field(default_factory=dict)
