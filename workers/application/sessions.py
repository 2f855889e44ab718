"""Session memory for a caller: messages written, entries recalled and rated, history for a
completion, and answers kept; every entry shown is one the caller may read every dataset of, now.
Each operation with a session (search, recall, remember) charges its LLM requests to the session
and touches its record; a session's summary is its record with the spend the ledger holds for it."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from pydantic import BaseModel, Field

from kenning.pipeline.errors import ConfigError, NotFound, StoreError
from kenning.pipeline.estimate import price
from kenning.pipeline.models import utcnow
from kenning.pipeline.redact import safe_error_text
from kenning.pipeline.session import (
    ModelUsage,
    SessionEntry,
    SessionKey,
    SessionRecord,
    SessionState,
    search_entries,
)
from kenning.pipeline.spend import Spend, in_session
from kenning.retrieval.contract import Hit, SearchResult
from kenning.retrieval.reference import lexical_score
from kenning.workers.application import gate
from kenning.workers.application.context import Context
from kenning.workers.application.conversation import message_item_ids
from kenning.workers.application.lifecycle import Message, Recollection, said_by

log = logging.getLogger(__name__)


class SessionSummary(BaseModel):
    """A session as its user is shown it: its state now, its times, and what its operations
    spent (every LLM request made for it, from the spend ledger) and the errors they met."""

    session_id: str
    user: str
    state: SessionState = Field(
        description="running (used in the last 5 minutes), idle, abandoned (unused for 30 minutes), ended"
    )
    started_at: datetime
    last_activity_at: datetime
    ended_at: datetime | None = None
    llm_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    errors: int = 0
    last_error: str = ""
    models: dict[str, ModelUsage] = Field(default_factory=dict, description="The usage of each model")


class SessionList(BaseModel):
    """The caller's sessions, the most recently used first."""

    sessions: list[SessionSummary]


@contextmanager
def operation(context: Context, session_id: str | None) -> Iterator[None]:
    """An operation of the caller's session (none: nothing is done): the LLM requests made in
    it (in this thread) are charged to the session, and its record is touched when it ends,
    with the error it failed with counted."""
    if session_id is None:
        yield
        return
    key = context.session_key(session_id)
    try:
        with in_session(key):
            yield
    except Exception as error:
        touch(context, key, safe_error_text(str(error)) or type(error).__name__)
        raise
    touch(context, key)


def touch(context: Context, key: SessionKey, error: str = "") -> None:
    """Note a use of the session in its record; a metadata database that is away is logged: the
    operation was done."""
    try:
        context.wiring.session_records.touch(key, error=error)
    except StoreError as failed:
        log.warning("session %r not recorded: %s", key.session_id, failed)


def charge_run(context: Context, session_id: str, run_id: str) -> None:
    """Charge a run that an operation of the session started (a remember's cognify) to the session."""
    try:
        context.wiring.spend.charge_run(run_id, context.session_key(session_id))
    except StoreError as failed:
        log.warning("run %s not charged to session %r: %s", run_id, session_id, failed)


def end(context: Context, session_id: str) -> None:
    """Mark the caller's session ended; NotFound when it has no record."""
    if not context.wiring.session_records.end(context.session_key(session_id)):
        raise NotFound(f"no session {session_id!r}")


def summaries(context: Context) -> list[SessionSummary]:
    """The caller's sessions, the most recently used first."""
    records = context.wiring.session_records.list(context.caller.tenant, context.caller.user)
    return summarized(context, records)


def summary(context: Context, session_id: str) -> SessionSummary:
    """The caller's session; NotFound when it has no record and no entry."""
    key = context.session_key(session_id)
    record = context.wiring.session_records.get(key) or _record_of_entries(context, key)
    if record is None:
        raise NotFound(f"no session {session_id!r}")
    return summarized(context, [record])[0]


def summarized(context: Context, records: Sequence[SessionRecord]) -> list[SessionSummary]:
    spent = context.wiring.spend.by_session([record.key for record in records])
    now = utcnow()
    return [_summary(context, record, spent.get(record.key, {}), now) for record in records]


def _summary(
    context: Context, record: SessionRecord, spent: dict[str, Spend], now: datetime
) -> SessionSummary:
    settings = context.settings

    def cost(spend: Spend) -> float:
        return price(
            spend.prompt_tokens,
            spend.completion_tokens,
            settings.llm_price_prompt_per_1k,
            settings.llm_price_completion_per_1k,
        )

    total = sum(spent.values(), Spend())
    models = {
        model: ModelUsage(
            tokens_in=spend.prompt_tokens,
            tokens_out=spend.completion_tokens,
            cost=cost(spend),
            calls=spend.calls,
        )
        for model, spend in sorted(spent.items())
    }
    return SessionSummary(
        session_id=record.key.session_id,
        user=record.key.user,
        state=record.state(now),
        started_at=record.started_at,
        last_activity_at=record.last_activity_at,
        ended_at=record.ended_at,
        llm_calls=total.calls,
        tokens_in=total.prompt_tokens,
        tokens_out=total.completion_tokens,
        cost=cost(total),
        errors=record.errors,
        last_error=record.last_error,
        models=models,
    )


def _record_of_entries(context: Context, key: SessionKey) -> SessionRecord | None:
    """A record for a session with entries but none of its own (written before records were)."""
    try:
        found = context.sessions().get_session(key)
    except (ConfigError, StoreError):
        return None
    if not found:
        return None
    return SessionRecord(key=key, started_at=found[0].time, last_activity_at=found[-1].time)


def write_messages(
    context: Context, messages: Sequence[Message], dataset: str | None, session_id: str
) -> list[str]:
    """Append the messages to the session, as entries of the dataset they go into, each citing
    the data item it becomes (so forgetting that item takes the entry away); their ids."""
    store, key = context.sessions(), context.session_key(session_id)
    into = dataset or context.settings.dataset
    items = message_item_ids(context, messages, into)
    entries = [
        SessionEntry(
            kind="message",
            question=m.text,
            speaker=m.speaker,
            said_at=m.time,
            data_ids=[item],
            dataset=into,
            datasets=[into],
        )
        for m, item in zip(messages, items, strict=True)
    ]
    for entry in entries:
        store.append(key, entry)
    return [entry.id for entry in entries]


def entries(context: Context, session_id: str, last_n: int | None = None) -> list[SessionEntry]:
    """The caller's session, oldest first: only the entries it may read every dataset of, now
    (`last_n`: of the newest n entries)."""
    found = context.sessions().get_session(context.session_key(session_id), last_n)
    return gate.visible(context.caller, found)


def recall(context: Context, session_id: str, query: str, top_k: int) -> list[Recollection]:
    """The session's best entries for the query (BM25 over messages and answered questions)."""
    best = search_entries([e for e in entries(context, session_id) if worth_recalling(e)], query, top_k)
    return [session_recollection(entry, score) for entry, score in best]


def history(context: Context, session_id: str) -> list[SessionEntry]:
    """The session's last exchanges the caller may read now, for a completion."""
    if not context.settings.session_history:
        return []
    try:
        found = entries(context, session_id)
    except (ConfigError, StoreError):
        return []  # no history is better than no answer; `keep_answer` says why
    return [entry for entry in found if worth_recalling(entry)][-context.settings.session_history :]


def keep_answer(context: Context, session_id: str, result: SearchResult, datasets: list[str]) -> None:
    """Append an answered search to the session, citing every dataset it read. A session store
    that is away is said in the result's notice, not raised."""
    key = context.session_key(session_id)
    try:
        if result.answer:
            graph = [graph_recollection(hit) for hit in result.results]
            entry = recalled_entry(result.query, graph, result.context, datasets)
            context.sessions().append(key, entry.model_copy(update={"answer": result.answer}))
    except (ConfigError, StoreError) as error:
        result.notice = "; ".join(filter(None, (result.notice, f"session memory unavailable: {error}")))


def session_recollection(entry: SessionEntry, bm25: float) -> Recollection:
    """A session entry as recalled; its BM25 score as every recollection's, in [0, 1]."""
    text = entry.question if entry.kind == "message" else f"Q: {entry.question}\nA: {entry.answer}"
    return Recollection(
        source="session",
        text=text,
        score=lexical_score(bm25),
        kind=entry.kind,
        dataset=entry.dataset,
        data_id=entry.data_ids[0] if entry.data_ids else None,
        entry_id=entry.id,
        speaker=entry.speaker,
        said_at=entry.said_at,
    )


def exchange(entry: SessionEntry) -> str:
    """One session entry as a line of history."""
    if entry.kind == "message":
        return f"{entry.speaker or 'user'}: {entry.question}"
    return f"Q: {entry.question}\nA: {entry.answer}"


def worth_recalling(entry: SessionEntry) -> bool:
    """Messages and answered questions; a bare recall query is no memory of its own."""
    return entry.kind == "message" or bool(entry.answer)


def recalled_entry(query: str, graph: list[Recollection], context: str, datasets: list[str]) -> SessionEntry:
    """A session entry of what a query read, citing every dataset it read."""
    return SessionEntry(
        kind="qa",
        question=query,
        context=context,
        element_ids=list(dict.fromkeys(r.chunk_id for r in graph if r.chunk_id)),
        data_ids=list(dict.fromkeys(r.data_id for r in graph if r.data_id)),
        dataset=datasets[0] if datasets else "",
        datasets=datasets,
    )


def graph_recollection(hit: Hit) -> Recollection:
    """A search hit as recalled: a remembered message with its speaker and the time it was said, and
    when its facts held where they do not hold at the moment asked."""
    speaker, said_at = said_by(hit.text) if hit.kind == "chunk" else ("", None)
    return Recollection(
        source="graph",
        text=hit.text,
        score=hit.score,
        kind=hit.kind,
        dataset=hit.dataset,
        data_id=hit.data_id,
        document_id=hit.document_id,
        chunk_id=hit.chunk_id,
        speaker=str(hit.extra.get("speaker") or speaker),
        said_at=said_at,
        held=str(hit.extra.get("held") or "") if hit.kind == "chunk" else "",
        instead=[str(fact) for fact in hit.extra.get("instead") or []],
    )
