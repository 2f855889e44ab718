"""Agent memory around the pipeline: messages to remember, what recall returns, and forgetting
(under the dataset's lock, then a load that rewrites what survived)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field

from kenning.pipeline.context import Job
from kenning.pipeline.errors import ConfigError, InputError
from kenning.pipeline.forget import Forgotten, drop_unrebuilt, forget_items
from kenning.pipeline.ingest import Source
from kenning.pipeline.locking import held, lock_name
from kenning.pipeline.memify import (
    Improvement,
    MemifyConfig,
    apply_weights,
    consolidate,
    feedback_weights,
    ratings,
    session_sources,
)
from kenning.pipeline.models import RUNNING, Dataset
from kenning.pipeline.permission import Caller, Permission
from kenning.pipeline.ports import MetadataStore
from kenning.pipeline.session import SessionEntry
from kenning.pipeline.tasks import load
from kenning.retrieval.contract import SearchType
from kenning.retrieval.conversation import mend_turns, turns_of
from kenning.retrieval.turn_cache import forget_turns
from kenning.workers.application import gate
from kenning.workers.application.context import Context
from kenning.workers.application.decay import AccessBuffer, stale_items
from kenning.workers.application.erasure import erase
from kenning.workers.application.ingest import add_sources
from kenning.workers.runtime.wiring import Wiring


def forget_job(dataset: Dataset) -> Job:
    run_id = f"forget-{uuid.uuid4().hex}"
    return Job(run_id=run_id, dataset_id=dataset.id, tenant=dataset.tenant, dataset=dataset.name)


def find_dataset(
    metadata: MetadataStore, tenant: str, name: str, readable: Callable[[Dataset], bool] | None = None
) -> Dataset:
    """The tenant's dataset of that name; InputError naming the datasets that exist otherwise (only
    those `readable` allows, when given: the error must not tell a caller what it may not read)."""
    datasets = [d for d in metadata.list_datasets(tenant) if readable is None or readable(d)]
    for dataset in datasets:
        if dataset.name == name:
            return dataset
    known = ", ".join(d.name for d in datasets) or "none"
    raise InputError(f"no dataset {name!r} (datasets: {known})")


def readable_dataset(context: Context, name: str | None) -> Dataset:
    """The dataset, if the caller may read it; the same InputError for one missing or not its."""
    return find_dataset(
        context.wiring.metadata,
        context.caller.tenant,
        name or context.settings.dataset,
        lambda d: gate.may_read(context.caller, d.scope),
    )


def deletable_dataset(context: Context, name: str | None) -> Dataset:
    """The dataset, if the caller may read it or delete from it (delete alone is a grant of its
    own); the same InputError for one missing or not its."""
    caller = context.caller
    return find_dataset(
        context.wiring.metadata,
        caller.tenant,
        name or context.settings.dataset,
        lambda d: gate.may_read(caller, d.scope) or gate.holds(caller, Permission.DELETE, d.scope),
    )


def forget(
    context: Context, dataset: str | None, data_ids: Sequence[str] | None, everything: bool, memory_only: bool
) -> list[Forgotten]:
    """See `Kenning.forget`; needs delete on each dataset forgotten from."""
    metadata = context.wiring.metadata
    if everything:
        targets = metadata.list_datasets(context.caller.tenant)
    else:
        targets = [deletable_dataset(context, dataset)]
    for target in targets:
        gate.require(context.caller, Permission.DELETE, target.scope)
    ttl = context.settings.lock_ttl_s
    ids = None if everything else data_ids
    return [forget_in_dataset(context.wiring, target, ids, memory_only, ttl) for target in targets]


def improve(context: Context, dataset: str | None, cognify: Callable[[str], object]) -> Improvement:
    """See `Kenning.improve`; `cognify(name)` makes the remembered answers memory."""
    target = readable_dataset(context, dataset)
    gate.require_write(context.caller, target.scope)
    wiring, caller = context.wiring, context.caller
    added = add_sources(context, session_items(wiring, target, caller), target.name).added
    if added:
        cognify(target.name)
    with held(wiring.lock, lock_name(target.scope), context.settings.lock_ttl_s):
        done = improve_held(wiring, target, context.settings.memify, caller)
    return done.model_copy(update={"session_items": len(added)})


def prune(
    context: Context,
    accessed: AccessBuffer,
    dataset: str | None,
    older_than_days: float | None,
    below: float | None,
) -> Forgotten:
    """See `Kenning.prune`; needs delete."""
    if older_than_days is None and below is None:
        raise ConfigError("prune needs older_than_days or below")
    accessed.flush()
    target = deletable_dataset(context, dataset)
    gate.require(context.caller, Permission.DELETE, target.scope)
    older = timedelta(days=older_than_days) if older_than_days is not None else None
    wiring, decay = context.wiring, context.settings.decay
    stale = stale_items(target, wiring.metadata, wiring.chunks, wiring.access, older, below, decay)
    if not stale:
        return Forgotten()
    return forget_in_dataset(wiring, target, stale, False, context.settings.lock_ttl_s)


def forget_in_dataset(
    wiring: Wiring, dataset: Dataset, data_ids: Sequence[str] | None, memory_only: bool, lock_ttl_s: float
) -> Forgotten:
    """Forget those items (all of the dataset's when None) and reload what still stands, under the
    embedded dataset lock."""
    with held(wiring.lock, lock_name(dataset.scope), lock_ttl_s):
        return forget_held(wiring, dataset, data_ids, memory_only)


def improve_held(
    wiring: Wiring, dataset: Dataset, config: MemifyConfig, improver: Caller | None = None
) -> Improvement:
    """Feedback weights and entity consolidation of one dataset; the caller holds its lock."""
    rated = ratings(entry for _, entry in session_entries(wiring, dataset, improver))
    weighted = apply_weights(wiring, dataset.scope, feedback_weights(rated, config.alpha))
    merged, repointed = consolidate(wiring, dataset.scope, config)
    return Improvement(weighted=weighted, merged_entities=merged, repointed_edges=repointed)


def session_items(wiring: Wiring, dataset: Dataset, improver: Caller | None = None) -> list[Source]:
    """The answered questions of the tenant's sessions about this dataset, as texts to remember
    (those `session_entries` gives)."""
    by_session: dict[str, list[SessionEntry]] = {}
    for session_id, entry in session_entries(wiring, dataset, improver):
        by_session.setdefault(session_id, []).append(entry)
    sources: list[Source] = []
    for session_id, entries in by_session.items():
        sources += session_sources(session_id, entries)
    return sources


def _active_runs(metadata: MetadataStore, dataset: Dataset) -> bool:
    return any(run.status in RUNNING for run in metadata.list_runs(dataset.id))


def session_entries(
    wiring: Wiring, dataset: Dataset, improver: Caller | None = None
) -> list[tuple[str, SessionEntry]]:
    """(session id, entry) of the dataset's tenant's sessions that `improve` may make data of it:
    entries built from this dataset alone (an answer that read another dataset too would carry
    that one's text into it), in sessions of users who may write it now (a reader's question
    must not become data). A user the permission store does not know counts as a writer only
    when it is `improver` itself, or when the deployment has no users (`gate.wrote_as_writer`)."""
    sessions = wiring.sessions
    if sessions is None:
        return []
    found = []
    for key in sessions.list_sessions(dataset.tenant):
        entries = [entry for entry in sessions.get_session(key) if entry.cited == [dataset.name]]
        if entries and gate.wrote_as_writer(wiring.permissions, key, dataset, improver):
            found += [(key.session_id, entry) for entry in entries]
    return found


def forget_held(
    wiring: Wiring, dataset: Dataset, data_ids: Sequence[str] | None, memory_only: bool
) -> Forgotten:
    """`forget_in_dataset` for a caller that already holds the dataset's lock."""
    job = forget_job(dataset)
    ids = [item.id for item in wiring.metadata.list_items(dataset.id)] if data_ids is None else data_ids
    chunk_ids = [chunk.id for chunk in wiring.chunks.chunks_of(dataset.id, ids)]
    wiring.access.forget_access(dataset.id, chunk_ids)
    # The turns beside a forgotten message embed its words: read its links before it goes.
    gone = turns_of(wiring.vectors, dataset.scope, chunk_ids) if data_ids is not None else {}
    forgotten = forget_items(wiring, job, ids, memory_only)
    # What this process keeps of the turns read goes with them (other processes drop theirs at
    # their next read of the dataset).
    forget_turns(wiring.vectors, dataset.scope, chunk_ids if data_ids is not None else None)
    if gone:
        mend_turns(wiring.vectors, wiring.embedder, dataset.scope, gone)
    if data_ids is None and not _active_runs(wiring.metadata, dataset):
        # A run waiting for the lock keeps its dataset (now empty) and completes with nothing to do.
        wiring.metadata.delete_dataset(dataset.id)
    else:
        if forgotten.reload_chunks:
            load(wiring, job)
        drop_unrebuilt(wiring, job, forgotten)
    if wiring.sessions is not None:
        # A dataset forgotten whole takes every entry built from it, citing an item or not.
        whole = [dataset.name] if data_ids is None else []
        wiring.sessions.forget_data(dataset.tenant, forgotten.items, whole)
    if forgotten.items or data_ids is None:
        forgotten.erased = erase(wiring, dataset, memory_only)
    # The vectors kept of embedded texts go too: this process's now, every other's before its
    # next embed (the forget mark).
    wiring.forget_embedded()
    return forgotten


class Message(BaseModel):
    """One message of a conversation, as an agent holds it."""

    speaker: str = ""
    text: str
    time: datetime | None = None
    id: str = Field(default="", description="The agent's id for the message; a new text under it replaces it")

    def as_text(self) -> str:
        """`[time] speaker: text`: the time and speaker stay with the words, for recall and "when"."""
        when = f"[{self.time.isoformat()}] " if self.time else ""
        who = f"{self.speaker}: " if self.speaker else ""
        return f"{when}{who}{self.text}"


_SAID = re.compile(r"^\[(?P<time>[0-9][0-9T:.+-]{9,40})\] (?:(?P<speaker>[^:\n\]]{1,200}): )?")


def said_by(text: str) -> tuple[str, datetime | None]:
    """The speaker and time a remembered message's text starts with (`Message.as_text`); ("", None)
    for a text that does not start with a time, such as a document's."""
    found = _SAID.match(text)
    if found is None:
        return "", None
    try:
        return found.group("speaker") or "", datetime.fromisoformat(found.group("time"))
    except ValueError:
        return "", None


class Remembered(BaseModel):
    """What remember did: the items added, the run that made them memory, and its status."""

    item_ids: list[str] = Field(default_factory=list)
    run_id: str | None = None
    status: str
    session_entries: list[str] = Field(default_factory=list)


class Recollection(BaseModel):
    """One recalled item and where it came from."""

    source: Literal["session", "graph"]
    text: str
    score: float = Field(
        ge=0.0,
        le=1.0,
        description="How well it matches, in [0, 1], higher is better, as for a search's hits: a session "
        "entry's BM25 as bm25 / (1 + bm25), a memory's the score its search type gave",
    )
    kind: str
    dataset: str = ""
    data_id: str | None = None
    document_id: str | None = None
    chunk_id: str | None = None
    entry_id: str | None = None
    speaker: str = ""
    said_at: datetime | None = None
    held: str = Field(
        default="",
        description="A remembered message whose facts on the question do not hold at the moment asked: "
        "when they held ('2023-01-10 to 2024-05'); empty otherwise",
    )
    instead: list[str] = Field(
        default_factory=list,
        description="The facts that hold instead, with since when ('Ana moved to Berlin (since 2024-05)')",
    )


class Recalled(BaseModel):
    query: str
    searched: list[SearchType] = Field(
        default_factory=list, description="The search types the datasets were searched with"
    )
    results: list[Recollection]
    answer: str | None = None
    notice: str = ""
    entry_id: str | None = Field(default=None, description="The session entry this recall added")
