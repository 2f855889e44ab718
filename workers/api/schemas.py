"""Request and response bodies of the HTTP API; pydantic validates each request against them."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    Tag,
    model_validator,
)
from pydantic.config import JsonDict

from kenning.pipeline.models import DataItem, PipelineRun
from kenning.pipeline.names import MAX_NAME_CHARS, name_problem
from kenning.pipeline.permission import Permission
from kenning.pipeline.session import SessionId
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


# `name_problem` as a pattern, which the OpenAPI document shows: no `/` (a dataset is
# `tenant/dataset` to read scopes), no control character (C0, C1), surrogate, line or paragraph
# separator or bidirectional override, and no space at either end (what `str.strip` removes that
# the refused characters do not already cover). Surrogates, refused too, are left out of it:
# a lone one has no UTF-8 and the regex engines of validators (pydantic's, jsonschema-rs) take no
# surrogate range. The name check enforces the whole rule.
_REFUSED = r"/\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\u200e\u200f"
_SPACE = r"\x20\xa0\u1680\u2000-\u200a\u202f\u205f\u3000"
NAME_PATTERN = rf"^[^{_REFUSED}{_SPACE}](?:[^{_REFUSED}]*[^{_REFUSED}{_SPACE}])?$"
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


def _json_integer(value: Any) -> Any:
    """A JSON number with no fraction, as the schema's `integer` reads it: never a string or boolean."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be an integer (a JSON number, not a string or boolean)")
    return value


# ISO 8601, as RFC 3339 writes it (an offset may be left out: then the time is as given).
_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}([Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:?\d{2})?)?")


def _iso_time(value: Any) -> Any:
    """An ISO 8601 date and time as a string; a number (seconds since 1970?) is refused, not guessed."""
    if not isinstance(value, str) or not _ISO_TIME.fullmatch(value):
        raise ValueError("must be an ISO 8601 date and time as a string, e.g. 2024-05-01T14:30:00Z")
    return value


# A moment to answer as of: a year or month (1000-2099), a date, or a date and time (RFC 3339; an
# offset may be left out: then it is UTC). What `pipeline.temporal.parse_moment` reads, as a schema.
YEAR_OR_MONTH = r"^(1\d{3}|20\d{2})(-(0[1-9]|1[0-2]))?$"
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?")
MOMENT_SCHEMA: JsonDict = {
    "anyOf": [{"pattern": YEAR_OR_MONTH}, {"format": "date"}, {"format": "date-time"}],
}
MOMENT_RULE = "a year, YYYY-MM, a date or an ISO 8601 date and time, e.g. 2024-05-01T14:30:00Z"


def moment_of(value: str) -> str:
    """The moment `value` names, as the memory reads it (an instant in UTC ends in Z); a moment
    before the year 1 or after 9999 in UTC is the first or last one there is."""
    if re.fullmatch(YEAR_OR_MONTH, value):
        return value
    if _DAY.fullmatch(value):
        return date.fromisoformat(value).isoformat()
    if not _INSTANT.fullmatch(value):
        raise ValueError(f"must be {MOMENT_RULE}")
    when = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1] in "Zz" else value)
    try:
        instant = when.astimezone(UTC) if when.tzinfo else when
    except OverflowError:
        instant = datetime.min if when.year == 1 else datetime.max
    return instant.replace(tzinfo=None).isoformat() + "Z"


Moment = Annotated[str, Field(max_length=40, json_schema_extra=MOMENT_SCHEMA), AfterValidator(moment_of)]

# Numbers and booleans as JSON has them: "2", "yes" and 0 are refused, not converted.
Integer = Annotated[int, BeforeValidator(_json_integer)]
IsoTime = Annotated[datetime, BeforeValidator(_iso_time)]
# A bucket name as S3 allows it, then an optional key prefix.
S3Uri = Annotated[
    str, Field(pattern=r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[^\x00-\x1f\x7f]*)?$", max_length=2048)
]


class Strict(BaseModel):
    """A request body: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


# An add names something to add: at least one text or one URI (the schema says so too).
SOMETHING_TO_ADD: JsonDict = {
    "anyOf": [
        {"required": ["texts"], "properties": {"texts": {"minItems": 1}}},
        {"required": ["uris"], "properties": {"uris": {"minItems": 1}}},
    ]
}


class AddText(Strict):
    """Texts and s3:// URIs to add, at least one of either; files are uploaded as
    multipart/form-data instead."""

    model_config = ConfigDict(json_schema_extra=SOMETHING_TO_ADD)

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


TOP_K = (
    "How many results at most, for every search type: a search of several rounds, sub-questions "
    "or steps (GRAPH_COMPLETION_COT, _CONTEXT_EXTENSION, _DECOMPOSITION, AGENTIC_COMPLETION) reads "
    "more for its context and gives its top_k best. The graph completion types give at most 15; "
    "CYPHER and NATURAL_LANGUAGE give the query's rows (at most KENNING_CYPHER_MAX_ROWS)"
)


class SearchIn(Strict):
    query: Text
    type: SearchType = SearchType.AUTO
    datasets: list[DatasetName] | None = Field(
        default=None, max_length=100, description="Default: every dataset the caller may read"
    )
    top_k: Integer = Field(default=10, ge=1, le=1000, description=TOP_K)
    only_context: StrictBool = Field(default=False, description="Stop before the LLM: hits and context")
    session_id: SessionId | None = None
    as_of: Moment | None = Field(
        default=None,
        description=f"Answer from the facts that held at this moment ({MOMENT_RULE}); default: from "
        "those that hold now",
    )


class MessageIn(Strict):
    """One message of a conversation."""

    speaker: str = Field(default="", description="Who said it")
    text: Text
    time: IsoTime | None = Field(default=None, description="When, as ISO 8601: 2024-05-01T14:30:00Z")
    id: str = Field(default="", description="The agent's id for the message; a new text under it replaces it")

    def message(self) -> Message:
        return Message(speaker=self.speaker, text=self.text, time=self.time, id=self.id)


def _text_or_messages(value: Any) -> str | None:
    """Which form `data` takes: a list is messages, anything else is read as a text."""
    return "messages" if isinstance(value, list) else "text"


class RememberIn(Strict):
    data: Annotated[
        Annotated[Text, Tag("text")]
        | Annotated[Annotated[list[MessageIn], Field(min_length=1, max_length=1000)], Tag("messages")],
        Discriminator(_text_or_messages),
    ] = Field(description="A text, or conversation messages ({speaker, text, time, id})")
    dataset: DatasetName | None = None
    session_id: SessionId | None = Field(
        default=None, description="Into this session now, into the graph in the background"
    )

    def content(self) -> str | list[Message]:
        return self.data if isinstance(self.data, str) else [message.message() for message in self.data]


class RecallIn(Strict):
    query: Text
    datasets: list[DatasetName] | None = Field(default=None, max_length=100)
    session_id: SessionId | None = None
    type: SearchType = SearchType.AUTO
    top_k: Integer = Field(default=10, ge=1, le=1000, description=TOP_K)
    as_of: Moment | None = Field(
        default=None,
        description=f"Answer from the facts that held at this moment ({MOMENT_RULE}); default: from "
        "those that hold now",
    )


class ForgetIn(Strict):
    dataset: DatasetName | None = None
    data_ids: list[Identifier] | None = Field(
        default=None, max_length=10_000, description="Default: the whole dataset"
    )
    memory_only: StrictBool = Field(default=False, description="Keep the stored bytes")


class Feedback(Strict):
    entry_id: Identifier
    score: Integer = Field(ge=1, le=5, description="1 (useless) to 5 (exactly right)")
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
