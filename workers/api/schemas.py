"""Request and response bodies of the HTTP API; pydantic validates each request against them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from kenning.pipeline.models import DataItem, PipelineRun
from kenning.pipeline.names import MAX_NAME_CHARS, name_problem
from kenning.pipeline.permission import Permission
from kenning.retrieval.contract import SearchType
from kenning.workers.application.lifecycle import Message

MAX_TEXT_CHARS = 1_000_000


def valid_name(field: str) -> Callable[[str], str]:
    """A pydantic check of a dataset or user name (`kenning.pipeline.names`), naming the field."""

    def check(value: str) -> str:
        problem = name_problem(value)
        if problem:
            raise ValueError(f"{field} {problem}")
        return value

    return check


# No `/` (a dataset is `tenant/dataset` to read scopes) and no control characters; the pattern
# is what the OpenAPI document shows, the check the whole rule.
NAME_PATTERN = r"^[^/\x00-\x1f\x7f]+$"
DatasetName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN),
    AfterValidator(valid_name("dataset")),
]
UserName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN),
    AfterValidator(valid_name("user")),
]
Identifier = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$")]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)]
# A bucket name as S3 allows it, then an optional key prefix.
S3Uri = Annotated[
    str, Field(pattern=r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\x00-\x1f\x7f]*)?$", max_length=2048)
]


class Strict(BaseModel):
    """A request body: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class AddText(Strict):
    """Texts and s3:// URIs to add; files are uploaded as multipart/form-data instead."""

    dataset: DatasetName | None = Field(default=None, description="Default: the server's default dataset")
    texts: list[Text] = Field(default_factory=list, max_length=1000)
    uris: list[S3Uri] = Field(default_factory=list, max_length=1000, description="s3://bucket/prefix")
    node_sets: list[Identifier] = Field(default_factory=list, max_length=100)

    @model_validator(mode="after")
    def _something(self) -> AddText:
        if not self.texts and not self.uris:
            raise ValueError("give texts or uris (or upload files as multipart/form-data)")
        return self


class ItemView(BaseModel):
    id: str
    name: str
    source: str
    size: int
    mime: str
    status: str

    @classmethod
    def of(cls, item: DataItem) -> ItemView:
        return cls(
            id=item.id,
            name=item.name,
            source=item.source,
            size=item.size,
            mime=item.mime,
            status=item.status.value,
        )


class Added(BaseModel):
    dataset: str
    added: list[ItemView]
    unchanged: list[ItemView]
    superseded: list[ItemView]
    skipped: list[str]
    errors: dict[str, str]


class CognifyIn(Strict):
    dataset: DatasetName | None = None


class RunView(BaseModel):
    """A pipeline run: its status, the last step done, and the counters of every step so far."""

    id: str
    dataset: str
    status: str = Field(description="initiated (waiting for the dataset), started, completed, ...")
    step: str = ""
    error: str = ""
    stats: dict[str, int] = Field(default_factory=dict)
    progress: dict[str, list[int]] = Field(
        default_factory=dict, description="step -> [done, total] while the run is followed here"
    )
    started_at: datetime | None = None
    finished_at: datetime | None = None
    stalled: str = Field(
        default="", description="Why a run not ended makes no progress (no worker, leases expired, ...)"
    )

    @classmethod
    def of(
        cls, run: PipelineRun, dataset: str, progress: dict[str, list[int]] | None = None, stalled: str = ""
    ) -> RunView:
        return cls(
            id=run.id,
            dataset=dataset,
            status=run.status.value,
            step=run.step,
            error=run.error,
            stats=run.stats,
            progress=progress or {},
            started_at=run.started_at,
            finished_at=run.finished_at,
            stalled=stalled,
        )


class RunList(BaseModel):
    """Recent runs, newest first."""

    runs: list[RunView]


class CancelIn(Strict):
    reason: str = Field(default="", max_length=2000, description="Why; kept in the run's error")


class SearchIn(Strict):
    query: Text
    type: SearchType = SearchType.AUTO
    datasets: list[DatasetName] | None = Field(
        default=None, max_length=100, description="Default: every dataset the caller may read"
    )
    top_k: int = Field(default=10, ge=1, le=1000)
    only_context: bool = False
    session_id: Identifier | None = None


class RememberIn(Strict):
    data: Text | Annotated[list[Message], Field(min_length=1, max_length=1000)] = Field(
        description="A text, or conversation messages ({speaker, text, time, id})"
    )
    dataset: DatasetName | None = None
    session_id: Identifier | None = Field(
        default=None, description="Into this session now, into the graph in the background"
    )


class RecallIn(Strict):
    query: Text
    datasets: list[DatasetName] | None = Field(default=None, max_length=100)
    session_id: Identifier | None = None
    type: SearchType = SearchType.AUTO
    top_k: int = Field(default=10, ge=1, le=1000)


class ForgetIn(Strict):
    dataset: DatasetName | None = None
    data_ids: list[Identifier] | None = Field(
        default=None, max_length=10_000, description="Default: the whole dataset"
    )
    memory_only: bool = Field(default=False, description="Keep the stored bytes")


class Feedback(Strict):
    entry_id: Identifier
    score: int = Field(ge=1, le=5, description="1 (useless) to 5 (exactly right)")
    text: str = Field(default="", max_length=10_000)


class Done(BaseModel):
    ok: bool = True


class RecordIn(Strict):
    text: Text
    dataset: DatasetName | None = None
    external_id: str = Field(default="", max_length=255, description="Names it for later updates")


class RecordText(Strict):
    text: Text


class DatasetView(BaseModel):
    name: str
    exists: bool
    created_at: datetime | None = None
    permissions: list[Permission]


class Datasets(BaseModel):
    datasets: list[DatasetView]


class GrantIn(Strict):
    user: UserName
    permissions: list[Permission] = Field(min_length=1, max_length=4)


class Grants(BaseModel):
    dataset: str
    grants: dict[str, list[Permission]] = Field(description="user -> permissions")


class Me(BaseModel):
    tenant: str
    user: str
    admin: bool
    grants: dict[str, list[Permission]]


class Status(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str = Field(description="`ready`, or `not_ready` (503) when a store does not answer")
    stores: dict[str, str] = Field(description="metadata, graph, vectors: `ok` or why not")
    llm_breaker: str | None = Field(
        default=None, description="The LLM circuit breaker: closed, open or half-open; null: no LLM endpoint"
    )
