"""Short-term memory of agents: the entries of a session, the ports that keep them, keyword search.

A session is one (tenant, user, session id): the same session id under another user or
tenant is another session. Its entries are answered queries ("qa") and remembered
messages ("message"), oldest first. Entries expire a while after the session's last write.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Callable, Sequence, Set
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kenning.pipeline.errors import InputError
from kenning.pipeline.lexical import bm25_term, query_terms, tokenize
from kenning.pipeline.models import utcnow

DEFAULT_TTL_S = 7 * 24 * 3600
ACTIVE_WITHIN = timedelta(minutes=5)
IDLE_AFTER = timedelta(minutes=30)

EntryKind = Literal["qa", "message"]
SessionStatus = Literal["running", "ended"]
SessionState = Literal["running", "idle", "abandoned", "ended"]

# The one rule for a session id, which every surface that takes one declares and checks (the HTTP
# API's schemas, the MCP tools'). The session stores keep an id as a file name of at most 240
# characters, with each character other than a-z, 0-9, "_" and "-" written as %XX: printable
# ASCII up to 80 always fits.
MAX_SESSION_ID_CHARS = 80
SESSION_ID_PATTERN = r"^[\x20-\x7e]+$"
SESSION_ID_RULE = f"1 to {MAX_SESSION_ID_CHARS} printable ASCII characters"
SessionId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_SESSION_ID_CHARS,
        pattern=SESSION_ID_PATTERN,
        description=f"A session: short-term memory of one conversation ({SESSION_ID_RULE})",
    ),
]


def check_session_id(session_id: str) -> str:
    """The session id if it keeps `SESSION_ID_RULE`; an InputError naming `session_id` otherwise."""
    if len(session_id) > MAX_SESSION_ID_CHARS or not re.fullmatch(SESSION_ID_PATTERN, session_id):
        raise InputError(f"session_id must be {SESSION_ID_RULE}, not {session_id[:MAX_SESSION_ID_CHARS]!r}")
    return session_id


class SessionKey(BaseModel):
    """Which session: tenant, user and the agent's session id."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    user: str
    session_id: str


def new_entry_id() -> str:
    return uuid.uuid4().hex


def check_score(score: int | None) -> int | None:
    """The feedback score if it is None or 1..5; ValueError otherwise."""
    if score is not None and not 1 <= score <= 5:
        raise ValueError(f"feedback score must be 1..5, not {score}")
    return score


class SessionEntry(BaseModel):
    """One answered query, or one remembered message (its text in `question`)."""

    id: str = Field(default_factory=new_entry_id)
    time: datetime = Field(default_factory=utcnow)
    kind: EntryKind = "qa"
    question: str = ""
    context: str = ""
    answer: str = ""
    speaker: str = ""
    said_at: datetime | None = None
    feedback_text: str = ""
    feedback_score: int | None = Field(default=None, ge=1, le=5)
    element_ids: list[str] = Field(default_factory=list)
    data_ids: list[str] = Field(default_factory=list)
    dataset: str = Field(default="", description="The first of `datasets` (all an older entry names)")
    datasets: list[str] = Field(default_factory=list, description="Every dataset it was built from")

    @field_validator("time")
    @classmethod
    def _in_utc(cls, value: datetime) -> datetime:
        # Naive times are taken as UTC, so entries from any caller sort on one clock.
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @property
    def cited(self) -> list[str]:
        """Every dataset the entry was built from: an older entry's one `dataset`, if any."""
        return self.datasets or ([self.dataset] if self.dataset else [])

    def with_feedback(self, text: str, score: int | None) -> SessionEntry:
        """A copy carrying this feedback; a score outside 1..5 raises ValueError."""
        return self.model_copy(update={"feedback_text": text, "feedback_score": check_score(score)})

    def without_feedback(self) -> SessionEntry:
        return self.model_copy(update={"feedback_text": "", "feedback_score": None})


class SessionStore(Protocol):
    """The entries of agent sessions; a session expires after its TTL with no write."""

    def append(self, key: SessionKey, entry: SessionEntry) -> None:
        """Add the entry at the end of the session, creating it (or restarting an expired one)."""
        ...

    def get_session(self, key: SessionKey, last_n: int | None = None) -> list[SessionEntry]:
        """The entries, oldest first; with `last_n`, only the newest n. Empty for an unknown session."""
        ...

    def add_feedback(self, key: SessionKey, entry_id: str, text: str, score: int | None) -> bool:
        """Set the entry's feedback; False when there is no such entry. A score outside 1..5
        raises ValueError before anything is looked up."""
        ...

    def delete_feedback(self, key: SessionKey, entry_id: str) -> bool:
        """Clear the entry's feedback; False when there is no such entry."""
        ...

    def forget_data(self, tenant: str, data_ids: Sequence[str], datasets: Sequence[str] = ()) -> int:
        """Remove every entry of the tenant's sessions that cites any of the data items, or any
        of the `datasets` (forgotten whole); how many (see `cites_any`).

        It does not extend the life of the sessions it changes."""
        ...

    def delete_session(self, key: SessionKey) -> None:
        """Remove the session; an unknown one is ignored."""
        ...

    def list_sessions(self, tenant: str, user: str | None = None) -> list[SessionKey]:
        """The tenant's live sessions (of one user, when given), sorted by user then session id."""
        ...


def cites_any(entry: SessionEntry, data_ids: Set[str], datasets: Set[str]) -> bool:
    """Whether the entry was built from any of the data items or datasets: a message cites the
    item it became, an answer every item and dataset it read. Any one forgotten takes it away,
    since its text may quote that one."""
    return not (data_ids.isdisjoint(entry.data_ids) and datasets.isdisjoint(entry.cited))


class FeedbackEditing:
    """`add_feedback` and `delete_feedback` for a session store that can rewrite one entry."""

    def _update(self, key: SessionKey, entry_id: str, change: Callable[[SessionEntry], SessionEntry]) -> bool:
        """Replace the entry by `change(entry)`; False when the session has no such entry."""
        raise NotImplementedError

    def add_feedback(self, key: SessionKey, entry_id: str, text: str, score: int | None) -> bool:
        check_score(score)
        return self._update(key, entry_id, lambda entry: entry.with_feedback(text, score))

    def delete_feedback(self, key: SessionKey, entry_id: str) -> bool:
        return self._update(key, entry_id, SessionEntry.without_feedback)


def search_entries(
    entries: Sequence[SessionEntry], query: str, limit: int
) -> list[tuple[SessionEntry, float]]:
    """The entries best matching the query by BM25 over question, answer and speaker, best first.

    The statistics are those of `entries` alone. Entries sharing no term with the query are
    left out; ties go to the newer entry (later in `entries`).
    """
    terms = query_terms(query)
    if not terms or limit <= 0:
        return []
    counts = [Counter(tokenize(f"{e.question}\n{e.answer}\n{e.speaker}")) for e in entries]
    lengths = [sum(count.values()) for count in counts]
    n = len(entries)
    average = sum(lengths) / n if n else 0.0
    df = {term: sum(1 for count in counts if term in count) for term in terms}
    scored: list[tuple[float, int]] = []
    for position, (count, length) in enumerate(zip(counts, lengths, strict=True)):
        matched = [term for term in terms if term in count]
        if matched:
            score = sum(bm25_term(count[t], df[t], n, length, average) for t in matched)
            scored.append((score, position))
    scored.sort(key=lambda hit: (-hit[0], -hit[1]))
    return [(entries[position], score) for score, position in scored[:limit]]


class ModelUsage(BaseModel):
    """What one model was used for in a session."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    calls: int = 0


class SessionRecord(BaseModel):
    """The lasting record of a session: status, times, usage and errors."""

    key: SessionKey
    status: SessionStatus = "running"
    started_at: datetime = Field(default_factory=utcnow)
    last_activity_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    estimated_cost: float = 0.0
    errors: int = 0
    last_error: str = ""
    models: dict[str, ModelUsage] = Field(default_factory=dict)

    def used(
        self,
        now: datetime,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
        model: str = "",
        error: str = "",
    ) -> SessionRecord:
        """The record after one more use: running again, the usage added (to the model's too, when
        named), the error counted."""
        models = {name: usage.model_copy() for name, usage in self.models.items()}
        if model:
            usage = models.setdefault(model, ModelUsage())
            usage.tokens_in += tokens_in
            usage.tokens_out += tokens_out
            usage.cost += cost
            usage.calls += 1
        return self.model_copy(
            update={
                "status": "running",
                "ended_at": None,
                "last_activity_at": now,
                "tokens_in": self.tokens_in + tokens_in,
                "tokens_out": self.tokens_out + tokens_out,
                "estimated_cost": self.estimated_cost + cost,
                "errors": self.errors + (1 if error else 0),
                "last_error": error or self.last_error,
                "models": models,
            }
        )

    def state(
        self,
        now: datetime | None = None,
        idle_after: timedelta = IDLE_AFTER,
        active_within: timedelta = ACTIVE_WITHIN,
    ) -> SessionState:
        """At `now` (default: the current time): "ended" once ended; else "running" when used within
        `active_within`, "idle" up to `idle_after` without use, "abandoned" after that."""
        if self.status == "ended":
            return "ended"
        quiet = (now or utcnow()) - self.last_activity_at
        if quiet > idle_after:
            return "abandoned"
        return "running" if quiet <= min(active_within, idle_after) else "idle"


class SessionRecords(Protocol):
    """The lasting records of sessions: one per session key, upserted as the session is used."""

    def touch(
        self,
        key: SessionKey,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost: float = 0.0,
        model: str = "",
        error: str = "",
    ) -> SessionRecord:
        """Record activity: create the record on first use (or re-open an ended one), add the
        usage (to the model's too, when named), count the error when given; the record after it."""
        ...

    def end(self, key: SessionKey) -> bool:
        """Mark the session ended, keeping the first end time if it already was; False when
        there is no record of it."""
        ...

    def get(self, key: SessionKey) -> SessionRecord | None:
        """The record, or None."""
        ...

    def list(self, tenant: str, user: str | None = None) -> list[SessionRecord]:
        """The tenant's records (of one user, when given), the most recently active first."""
        ...
