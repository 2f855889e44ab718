"""Search for a caller: the datasets it may read, its session's history, the search type run under
metrics and tracing with its LLM requests charged to it, decay applied, and the answer kept in its
session, citing what it read."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from kenning.pipeline.models import Dataset
from kenning.pipeline.spend import charged_to
from kenning.retrieval.contract import SearchRequest, SearchResult, SearchType
from kenning.retrieval.registry import search as run_search_type
from kenning.workers.application import gate, sessions
from kenning.workers.application.context import Context
from kenning.workers.application.decay import AccessBuffer, fade
from kenning.workers.application.lifecycle import readable_dataset
from kenning.workers.runtime.metrics import timed_search
from kenning.workers.runtime.tracing import traced


def search(
    context: Context,
    accessed: AccessBuffer,
    query: str,
    type: str | SearchType,
    *,
    datasets: Sequence[str] | None,
    top_k: int,
    only_context: bool,
    session_id: str | None,
    options: Mapping[str, Any] | None,
    as_of: str | None = None,
) -> SearchResult:
    """See `Kenning.search`; `accessed` notes what was returned, for decay and prune."""
    with sessions.operation(context, session_id):
        return _search(
            context, accessed, query, type, datasets, top_k, only_context, session_id, options, as_of
        )


def _search(
    context: Context,
    accessed: AccessBuffer,
    query: str,
    type: str | SearchType,
    datasets: Sequence[str] | None,
    top_k: int,
    only_context: bool,
    session_id: str | None,
    options: Mapping[str, Any] | None,
    as_of: str | None = None,
) -> SearchResult:
    # A dataset the caller may not read is left out, silently: no error tells it exists.
    scopes = [context.scope(name) for name in readable(context, datasets)]
    if not scopes:
        return SearchResult(query=query, type=SearchType(type), results=[], context="")
    searched = [readable_dataset(context, scope.dataset) for scope in scopes]
    history = sessions.history(context, session_id) if session_id and not only_context else []
    request = SearchRequest(
        query=query,
        type=SearchType(type),
        scopes=scopes,
        top_k=top_k,
        only_context=only_context,
        session_id=session_id,
        principal=gate.principal(context.caller, context.settings),
        history=[sessions.exchange(entry) for entry in history],
        options=dict(options or {}),
        as_of=as_of,
    )
    with (
        timed_search(request.type.value),
        traced(context.settings.otel_endpoint, "kenning.search", type=request.type.value),
        # Its completions, once each, to every dataset it searched (see kenning.pipeline.spend).
        charged_to(f"search-{uuid.uuid4().hex}", searched[0].id, "completion", [d.id for d in searched[1:]]),
    ):
        result = faded(context, accessed, run_search_type(context.wiring, request), searched)
    if session_id is not None:
        # The answer read the datasets searched and those the history it was shown cites.
        read = [scope.dataset for scope in scopes] + [name for entry in history for name in entry.cited]
        sessions.keep_answer(context, session_id, result, list(dict.fromkeys(read)))
    return result


def readable(context: Context, datasets: Sequence[str] | None) -> list[str]:
    """Those of the datasets named (default: KENNING_DATASET) the caller may read, in order."""
    names = dict.fromkeys(datasets or [context.settings.dataset])
    return [name for name in names if gate.may_read(context.caller, context.scope(name))]


def faded(
    context: Context, accessed: AccessBuffer, result: SearchResult, searched: Sequence[Dataset]
) -> SearchResult:
    """Decay applied to the hits, and their retrieval noted (in batches) for decay and prune."""
    datasets = {dataset.name: dataset for dataset in searched}
    wiring = context.wiring
    done = fade(result, datasets, wiring.access, wiring.metadata, context.settings.decay)
    for name, dataset in datasets.items():
        used = [hit.chunk_id for hit in done.results if hit.dataset == name and hit.chunk_id]
        if used:
            accessed.note(dataset.id, used)
    return done
