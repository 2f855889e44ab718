"""The one validated settings object, read from `KENNING_*` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from kenning.pipeline.checks import DEFAULT_ENTITY_TYPES
from kenning.pipeline.chunking import ChunkingConfig
from kenning.pipeline.context import PipelineConfig
from kenning.pipeline.decay import DecayConfig
from kenning.pipeline.loaders import InputLimits
from kenning.pipeline.memify import MemifyConfig
from kenning.pipeline.permission import escape_glob
from kenning.pipeline.ratelimit import Limits
from kenning.pipeline.validity import DEFAULT_FUNCTIONAL, DEFAULT_SYNONYMS, Direction, FactRules
from kenning.workers.runtime.schedule import DEFAULT_SCHEDULE, ScheduleEntry
from kenning.workers.runtime.validation import (
    EntityTypes,
    HttpUrl,
    Name,
    RedisUrl,
    RunMode,
    S3Allow,
    ScopePatterns,
    SqlUrl,
    check_graph_url,
    config_error,
    derived_mode,
)


class Settings(BaseSettings):
    """Every setting of kenning. Bad values fail here, at startup, never at first use."""

    model_config = SettingsConfigDict(env_prefix="KENNING_", extra="ignore", frozen=True)

    mode: RunMode = Field(
        default="embedded",
        description="embedded (one process runs cognify, a file lock) or distributed (Celery workers, "
        "the Redis lock); not given: distributed when vectors and metadata are on servers "
        "(KENNING_QDRANT_URL and a PostgreSQL KENNING_METADATA_URL), else embedded",
    )
    home: Path = Field(default=Path(".kenning"), description="Where embedded data lives")
    home_private: bool = Field(
        default=True,
        description="Keep the home private: directories 0700 and files 0600 (the process umask "
        "is tightened to 077 when the home is opened); false: the umask decides",
    )
    blob_grace_s: float = Field(
        default=300.0,
        ge=0,
        description="After a forget, stored bytes no item refers to are removed once older than this "
        "(a younger blob may belong to an add in flight)",
    )
    tenant: Name = "default"
    dataset: Name = "main"

    metadata_url: SqlUrl = Field(default="", description="SQLAlchemy URL; default SQLite under home")
    graph_backend: Literal["sql", "memgraph", "falkordb"] = "sql"
    graph_url: str = Field(
        default="",
        description="sql: SQLAlchemy URL (default metadata_url); "
        "memgraph: bolt://host:7687; falkordb: redis://host:port",
    )
    graph_user: str = ""
    graph_password: str = ""
    graph_name: str = "kenning"
    vector_backend: Literal["auto", "edge", "qdrant"] = Field(
        default="auto",
        description="edge: Qdrant Edge under home; qdrant: qdrant-client (qdrant_url, else local mode "
        "under home); auto: qdrant when qdrant_url is set, else edge",
    )
    qdrant_url: HttpUrl = Field(default="", description="A Qdrant server; empty = an engine under home")
    qdrant_api_key: str = ""
    s3_endpoint_url: HttpUrl = Field(default="", description="Any S3-compatible store; empty = boto3's own")
    s3_allow: S3Allow = Field(
        default_factory=list,
        description="s3://bucket/prefix=tenant entries, comma separated or a JSON list: where each "
        "tenant's callers may add from; empty: only the local operator reads buckets",
    )

    embedding_provider: Literal["local", "openai", "hash"] = "local"
    embedding_url: HttpUrl = ""
    embedding_api_key: str = ""
    embedding_model: str = "text-embedding-3-small"
    embedding_dimension: int = Field(default=384, ge=8)

    llm_url: HttpUrl = Field(default="", description="OpenAI-compatible base URL (with /v1); empty = offline")
    llm_api_key: str = ""
    llm_model: str = "gpt-4o-mini"
    llm_timeout_s: float = Field(
        default=60.0, gt=0, description="No byte from the LLM for this long (answers stream): it is dead"
    )
    llm_max_retries: int = Field(default=4, ge=0)
    llm_deadline_s: float = Field(
        default=1200.0, gt=0, description="One LLM call, all its retries included; however slowly it streams"
    )
    llm_breaker_failures: int = Field(
        default=5,
        ge=1,
        description="Connection failures in a row, all workers together, after which LLM calls fail fast",
    )
    llm_breaker_cooldown_s: float = Field(
        default=30.0, ge=0, description="How long an open LLM breaker fails calls before one may try"
    )
    llm_price_prompt_per_1k: float = Field(
        default=0.0, ge=0, description="Currency units per 1k prompt tokens"
    )
    llm_price_completion_per_1k: float = Field(default=0.0, ge=0, description="... per 1k completion tokens")
    llm_rpm: int = Field(default=0, ge=0, description="LLM requests a minute, all workers; 0: none; >= 3")
    llm_tpm: int = Field(default=0, ge=0, description="LLM tokens a minute, all workers together; 0: none")
    llm_limit_per_tenant: bool = Field(default=False, description="One rpm/tpm budget per tenant")
    llm_structured: Literal["auto", "json_schema", "json_object", "prompt"] = Field(
        default="auto",
        description="How extraction asks for JSON; auto: json_schema, then json_object with the schema, "
        "then a prompt, the first the endpoint takes (remembered per endpoint and model)",
    )
    entity_types: EntityTypes = Field(
        default=DEFAULT_ENTITY_TYPES,
        description="The entity types the graph keeps, comma separated; a model's others are mapped to them",
    )

    chunk_size: int = Field(default=256, ge=16)
    chunk_overlap: int = Field(default=24, ge=0)
    extraction_unit_tokens: int = Field(
        default=2000, ge=0, description="Most chunk tokens one LLM extraction call reads; 0: one chunk a call"
    )
    extract_batch: int = Field(default=8, ge=1)
    load_batch: int = Field(default=32, ge=1)
    max_document_bytes: int = Field(default=64 * 2**20, ge=1)
    max_unpacked_bytes: int = Field(
        default=64 * 2**20, ge=1, description="Most bytes one item expands into: archive members, its text"
    )
    max_unpack_ratio: int = Field(
        default=100, ge=1, description="Most times its own size one item expands into (1 MiB always may)"
    )
    max_json_depth: int = Field(default=100, ge=1, description="Deepest nesting of a JSON document")
    api_max_upload_bytes: int = Field(
        default=64 * 2**20, ge=1, description="The HTTP API's limit on one request body (uploads)"
    )
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="Where a Celery worker answers Prometheus scrapes; 0: off"
    )
    otel_endpoint: HttpUrl = Field(
        default="", description="An OTLP/HTTP traces URL: spans of searches and runs; empty: tracing off"
    )
    temporal: bool = Field(default=False, description="Also extract dated events (TEMPORAL search)")
    functional_relations: dict[str, Direction] = Field(
        default_factory=lambda: dict(DEFAULT_FUNCTIONAL),
        description='Relations of one value at a time, as JSON: {"lives_in": "source", "ceo_of": "target"} '
        "(the end that has one value: source, target or both); replaces the defaults",
    )
    relation_synonyms: dict[str, str] = Field(
        default_factory=dict,
        description='More names of relations, as JSON: {"dwells_in": "lives_in"}; added to the defaults',
    )
    facts_llm: bool = Field(
        default=False,
        description="With an LLM configured, also ask it which of an entity's facts a new fact ends: "
        "one call per entity a load batch gives new facts, beside the offline rules",
    )
    fk_references: dict[str, str] = Field(
        default_factory=dict,
        description='CSV/JSON key columns naming no table, e.g. {"employer_id": "companies"}',
    )
    cypher_enabled: bool = Field(default=False, description="Allow CYPHER and NATURAL_LANGUAGE search")
    read_scopes: ScopePatterns = Field(
        default_factory=list,
        description="tenant/dataset patterns this process may search; empty = own tenant",
    )
    cypher_tenants: list[str] = Field(default_factory=list, description="Tenants allowed Cypher; empty = all")
    cypher_timeout_ms: int = Field(
        default=5000, ge=1, le=120_000, description="The graph server stops a Cypher query after this"
    )
    cypher_max_rows: int = Field(default=200, ge=1, description="Rows a Cypher query returns at most")
    concurrency: int = Field(
        default=32,
        ge=1,
        le=256,
        description="Extractions in flight at most, embedded; with KENNING_LLM_RPM, as many as reach it",
    )
    user: str = Field(default="local", min_length=1, description="The user sessions belong to")
    session_backend: Literal["file", "redis", "none"] = Field(
        default="file", description="Session memory: files under home, Redis (shared), or none"
    )
    session_ttl_s: int = Field(default=7 * 24 * 3600, ge=0, description="Session expiry; 0 = never")
    session_history: int = Field(default=10, ge=0, description="Entries given to completions as history")
    decay_half_life_days: float = Field(
        default=0.0, ge=0, description="Search scores fade with this half-life since last use; 0 = off"
    )
    decay_weight: float = Field(default=0.3, ge=0, description="Distance added to a fully faded hit")
    improve_alpha: float = Field(default=0.3, gt=0, le=1, description="How far one rating moves a weight")
    merge_similarity: float = Field(
        default=0.0, ge=0, le=1, description="improve also merges same-type entities this similar; 0 = off"
    )

    broker_url: str = "redis://127.0.0.1:6379/0"
    result_backend: str = "redis://127.0.0.1:6379/1"
    redis_url: RedisUrl = Field(default="redis://127.0.0.1:6379/0", description="Locks and coordination")
    lock_ttl_s: float = Field(default=600.0, gt=0)
    lock_wait_s: float = Field(default=3600.0, gt=0, description="How long a run waits for its dataset")
    broker_visibility_timeout_s: float = Field(
        default=7200.0, gt=0, description="Unacknowledged tasks are redelivered after this; > longest task"
    )
    max_redeliveries: int = Field(default=5, ge=0, description="Deliveries of a task beyond the first")
    lease_s: float = Field(
        default=60.0, gt=0, description="Leases of a run's tasks last this; a run with none left is dead"
    )
    supervise_every_s: float = Field(
        default=30.0, gt=0, description="How often each worker looks for dead runs to interrupt and resume"
    )
    store_retry_s: float = Field(
        default=60.0, ge=0, description="How long a task rides out an unreachable store before it gives up"
    )
    query_timeout_s: float = Field(default=120.0, gt=0, description="How long --remote waits for an answer")
    cognify_timeout_s: float = Field(default=6 * 3600.0, gt=0, description="How long --distributed follows")
    queue_prefix: str = "kenning"
    schedule: dict[str, ScheduleEntry] = Field(
        default_factory=lambda: {name: ScheduleEntry(**entry) for name, entry in DEFAULT_SCHEDULE.items()},
        description="Celery beat jobs (JSON): {name: {task, every_s | cron, arguments}}",
    )

    @model_validator(mode="before")
    @classmethod
    def _derive_mode(cls, values: Any) -> Any:
        if isinstance(values, dict) and not values.get("mode"):
            values = {**values, "mode": derived_mode(values.get("qdrant_url"), values.get("metadata_url"))}
        return values

    @model_validator(mode="after")
    def _check(self) -> Settings:
        ChunkingConfig(size=self.chunk_size, overlap=self.chunk_overlap)
        Limits(rpm=self.llm_rpm, tpm=self.llm_tpm)
        check_graph_url(self.graph_backend, self.graph_url)
        if self.embedding_provider == "openai" and not self.embedding_url:
            raise ValueError("embedding_provider 'openai' needs KENNING_EMBEDDING_URL")
        if self.vector_backend == "edge" and self.qdrant_url:
            raise ValueError("vector_backend 'edge' keeps vectors under home; a Qdrant URL needs 'qdrant'")
        return self

    @property
    def readable(self) -> list[str]:
        """The tenant/dataset glob patterns searches may read."""
        return self.read_scopes or [f"{escape_glob(self.tenant)}/*"]

    @property
    def metadata_dsn(self) -> str:
        return self.metadata_url or f"sqlite:///{(self.home / 'kenning.db').resolve()}"

    @property
    def graph_dsn(self) -> str:
        return self.graph_url or self.metadata_dsn

    @property
    def vector_engine(self) -> Literal["edge", "qdrant"]:
        """The vector backend in use: `auto` resolved by whether a Qdrant server is configured."""
        if self.vector_backend == "auto":
            return "qdrant" if self.qdrant_url else "edge"
        return self.vector_backend

    @property
    def vector_path(self) -> Path:
        return (self.home / "vectors").resolve()

    @property
    def qdrant_path(self) -> Path:
        return (self.home / "qdrant").resolve()

    @property
    def decay(self) -> DecayConfig:
        return DecayConfig(half_life_days=self.decay_half_life_days, weight=self.decay_weight)

    @property
    def memify(self) -> MemifyConfig:
        return MemifyConfig(alpha=self.improve_alpha, merge_similarity=self.merge_similarity)

    @property
    def session_dir(self) -> Path:
        return (self.home / "sessions").resolve()

    @property
    def blob_dir(self) -> Path:
        return (self.home / "blobs").resolve()

    @property
    def pipeline(self) -> PipelineConfig:
        return PipelineConfig(
            chunking=ChunkingConfig(
                size=self.chunk_size, overlap=self.chunk_overlap, unit_tokens=self.extraction_unit_tokens
            ),
            extract_batch=self.extract_batch,
            load_batch=self.load_batch,
            max_document_bytes=self.max_document_bytes,
            inputs=InputLimits(
                max_unpacked_bytes=self.max_unpacked_bytes,
                max_unpack_ratio=self.max_unpack_ratio,
                max_json_depth=self.max_json_depth,
            ),
            temporal=self.temporal,
            references=self.fk_references,
            facts=FactRules(
                functional=self.functional_relations,
                synonyms={**DEFAULT_SYNONYMS, **self.relation_synonyms},
                llm_endings=self.facts_llm,
            ),
            entity_types=self.entity_types,
        )


def in_mode(settings: Settings, mode: RunMode) -> Settings:
    """The settings with `mode` forced (`serve --distributed`, a Celery worker): the one place the
    mode is decided, whatever was given or derived."""
    return settings if settings.mode == mode else settings.model_copy(update={"mode": mode})


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment (and overrides); a bad value is a `ConfigError`."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except (ValidationError, SettingsError) as exc:
        raise config_error(exc, Settings) from exc
