"""Session memory for a caller: messages written, entries recalled and rated, history for a
completion, and answers kept; every entry shown is one the caller may read every dataset of, now."""

from __future__ import annotations

from collections.abc import Sequence

from kenning.pipeline.errors import ConfigError, StoreError
from kenning.pipeline.session import SessionEntry, search_entries
from kenning.retrieval.contract import Hit, SearchResult
from kenning.workers.application import gate
from kenning.workers.application.context import Context
from kenning.workers.application.conversation import message_item_ids
from kenning.workers.application.lifecycle import Message, Recollection


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
    """Append an answered search to the session, citing every dataset it read; touch the session's
    record. A session store that is away is said in the result's notice, not raised."""
    key = context.session_key(session_id)
    try:
        if result.answer:
            graph = [graph_recollection(hit) for hit in result.results]
            entry = recalled_entry(result.query, graph, result.context, datasets)
            context.sessions().append(key, entry.model_copy(update={"answer": result.answer}))
        context.wiring.session_records.touch(key)
    except (ConfigError, StoreError) as error:
        result.notice = "; ".join(filter(None, (result.notice, f"session memory unavailable: {error}")))


def session_recollection(entry: SessionEntry, score: float) -> Recollection:
    text = entry.question if entry.kind == "message" else f"Q: {entry.question}\nA: {entry.answer}"
    return Recollection(
        source="session",
        text=text,
        score=score,
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
    return Recollection(
        source="graph",
        text=hit.text,
        score=1.0 - hit.score,
        kind=hit.kind,
        dataset=hit.dataset,
        data_id=hit.data_id,
        document_id=hit.document_id,
        chunk_id=hit.chunk_id,
    )
