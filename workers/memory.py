"""The Python API: add, cognify, search and status over one set of settings."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import timedelta
from itertools import islice
from typing import Any

from kenning.pipeline.context import Job
from kenning.pipeline.errors import ConfigError, InputError, StoreError, TransientStoreError
from kenning.pipeline.estimate import Estimate, estimate, price
from kenning.pipeline.forget import Forgotten
from kenning.pipeline.ingest import (
    AddResult,
    Source,
    add,
    bucket_sources,
    known_versions,
    path_sources,
    text_source,
)
from kenning.pipeline.locking import held, lock_name
from kenning.pipeline.memify import Improvement
from kenning.pipeline.models import (
    ChunkRecord,
    ChunkStatus,
    DataItem,
    Dataset,
    ItemStatus,
    PipelineRun,
    RunStatus,
    Scope,
)
from kenning.pipeline.permission import Caller
from kenning.pipeline.ports import ObjectSource, StoredObject
from kenning.pipeline.session import SessionEntry, SessionKey, SessionStore, search_entries
from kenning.retrieval.contract import Hit, Principal, SearchRequest, SearchResult, SearchType
from kenning.retrieval.conversation import TURNS, Turn, context_text, turn_points
from kenning.retrieval.registry import search
from kenning.workers.application import gate
from kenning.workers.application.decay import AccessBuffer, fade, stale_items
from kenning.workers.application.lifecycle import (
    Message,
    Recalled,
    Recollection,
    Remembered,
    find_dataset,
    forget_in_dataset,
    improve_held,
    session_items,
)
from kenning.workers.application.records import Records
from kenning.workers.runtime.extras import needs_extra
from kenning.workers.runtime.local_runner import ProgressCallback, close_dead_runs, no_progress
from kenning.workers.runtime.metrics import timed_search
from kenning.workers.runtime.settings import Settings, in_mode, load_settings
from kenning.workers.runtime.tracing import traced
from kenning.workers.runtime.wiring import Wiring

SPEND_COUNTERS = ("llm_calls", "prompt_tokens", "completion_tokens")

log = logging.getLogger(__name__)


class Kenning:
    """Long-term memory over one configuration: embedded by default, or on shared servers.

    >>> memory = Kenning(load_settings(home=tmp_home, embedding_provider="hash"))
    >>> memory.add_text("Ada Lovelace wrote the first program.").added[0].name
    'text'
    >>> memory.cognify().status.value
    'completed'
    >>> memory.search("Who wrote the first program?", type="CHUNKS").results[0].text
    'Ada Lovelace wrote the first program.'
    >>> memory.close()
    """

    _caller: Caller | None = None  # set by `as_caller`; None: the local operator

    def __init__(self, settings: Settings | None = None, wiring: Wiring | None = None) -> None:
        self.wiring = wiring or Wiring(settings or load_settings())
        # In the wiring's mode, which a flag such as `serve --distributed` may have forced.
        self.settings = in_mode(settings or self.wiring.settings, self.wiring.settings.mode)
        self._bridges: list[threading.Thread] = []
        self._accessed = AccessBuffer(lambda: self.wiring.access)

    @property
    def caller(self) -> Caller:
        """Who this memory acts for: the caller given to `as_caller`, else the local operator (the
        settings' tenant and user, an admin reading KENNING_READ_SCOPES)."""
        return self._caller or gate.operator(self.settings)

    def scope(self, dataset: str | None = None) -> Scope:
        return Scope(tenant=self.caller.tenant, dataset=dataset or self.settings.dataset)

    def add(
        self, sources: Sequence[Source], dataset: str | None = None, node_sets: Sequence[str] = ()
    ) -> AddResult:
        """Add the sources; `node_sets` name the subsets every one of them joins, besides their own."""
        gate.require_write(self.caller, self.scope(dataset))
        if node_sets:
            sources = [_with_node_sets(source, node_sets) for source in sources]
        return add(self.wiring.metadata, self.wiring.blobs, self.scope(dataset), sources)

    def add_text(
        self, text: str, dataset: str | None = None, name: str = "text", node_sets: Sequence[str] = ()
    ) -> AddResult:
        return self.add([text_source(text, name)], dataset, node_sets)

    def add_paths(
        self, paths: Sequence[str], dataset: str | None = None, node_sets: Sequence[str] = ()
    ) -> AddResult:
        """Add files, directories, `-` (stdin) and `s3://bucket/prefix` URIs, into `node_sets` if given.

        Unreadable paths and objects are reported in the result, not raised. A bucket is read only
        under a prefix KENNING_S3_ALLOW maps to the caller's tenant; with no allow-list, only the
        local operator reads buckets. A refused bucket and a missing one give the same error.
        """
        gate.require_write(self.caller, self.scope(dataset))
        errors: dict[str, str] = {}
        local = [path for path in paths if not path.startswith("s3://")]
        found = path_sources(local, errors, self.settings.max_document_bytes)
        result = self.add(list(found), dataset, node_sets)
        result.errors.update(errors)
        for uri in (path for path in paths if path.startswith("s3://")):
            self._add_bucket(uri, dataset, result, node_sets)
        return result

    def _add_bucket(
        self, uri: str, dataset: str | None, result: AddResult, node_sets: Sequence[str] = ()
    ) -> None:
        with needs_extra("reading s3:// sources"):
            from kenning.storage.sources.s3 import S3Source, parse_s3_uri

        bucket, prefix = parse_s3_uri(uri)
        if not gate.may_read_bucket(self.caller, self.settings.s3_allow, bucket, prefix):
            result.errors[uri] = gate.UNREADABLE_BUCKET
            return
        source = Listed(S3Source(bucket, self.settings.s3_endpoint_url or None))
        known = known_versions(self.wiring.metadata, self.scope(dataset))
        found = AddResult()
        sources = bucket_sources(
            source, f"s3://{bucket}", prefix, known, found, self.settings.max_document_bytes
        )
        try:
            for batch in batched(sources, 64):
                added = self.add(batch, dataset, node_sets)
                result.added += added.added
                result.unchanged += added.unchanged
        except Unlisted:  # missing, or not ours: the same answer as a bucket refused
            result.errors[uri] = gate.UNREADABLE_BUCKET
        result.skipped += found.skipped
        result.errors.update(found.errors)

    def dataset(self, name: str | None = None) -> Dataset:
        """The tenant's dataset of that name (default: KENNING_DATASET); an InputError listing the
        datasets there are when it does not exist. Only `add` creates datasets."""
        return find_dataset(self.wiring.metadata, self.caller.tenant, name or self.settings.dataset)

    def cognify(self, dataset: str | None = None, progress: ProgressCallback = no_progress) -> PipelineRun:
        self.dataset(dataset)
        try:
            return self.wiring.runner(progress).run(self.scope(dataset))
        finally:
            self._flush_spend()

    def _flush_spend(self) -> None:
        """Write the spend held while the metadata database was away: a run's spend is whole when
        it returns. Still away: logged, not raised; bookkeeping does not fail work that is done."""
        try:
            self.wiring.flush_spend()
        except StoreError as error:
            log.error("LLM spend still held, not written (%d writes): %s", self.wiring.spend.held, error)

    # Memory for agents

    def remember(
        self,
        data: str | Sequence[Message | dict[str, Any]],
        dataset: str | None = None,
        session_id: str | None = None,
    ) -> Remembered:
        """Make text or conversation messages memory. Without a session: add, then cognify, now.
        With one: written to the session at once, and into the graph by a background cognify."""
        if isinstance(data, str):
            data = [Message(text=data)]
        messages = [Message.model_validate(message) for message in data]
        if session_id is None:
            added = self.add_messages(messages, dataset)
            run = self.cognify(dataset)
            self.index_turns(messages, added, dataset)
            return Remembered(item_ids=[i.id for i in added], run_id=run.id, status=run.status.value)
        entries = self.session_messages(messages, dataset, session_id)
        bridge = threading.Thread(target=self._bridge, args=(messages, dataset), name="kenning-remember")
        bridge.start()
        self._bridges.append(bridge)
        return Remembered(status="queued", session_entries=entries)

    def add_messages(self, messages: Sequence[Message], dataset: str | None) -> list[DataItem]:
        sources = [message_source(m, n) for n, m in enumerate(messages)]
        added = self.add(sources, dataset)
        return added.added + added.unchanged

    def index_turns(self, messages: Sequence[Message], items: Sequence[DataItem], dataset: str | None) -> int:
        """Index the messages, in order, as the turns of one conversation for CONVERSATION recall:
        each read after the turn before it and linked to its neighbours. Messages whose item has
        no chunk (failed, or empty) are left out. Returns the turns indexed."""
        by_source = {item.source: item for item in items}
        found = [(m, by_source.get(message_source(m, n).uri)) for n, m in enumerate(messages)]
        wanted = [(m, item) for m, item in found if item is not None]
        target = self.dataset(dataset)
        first_chunks: dict[str, ChunkRecord] = {}
        for chunk in self.wiring.chunks.chunks_of(target.id, [item.id for _, item in wanted]):
            known = first_chunks.get(chunk.data_id)
            if known is None or chunk.index < known.index:
                first_chunks[chunk.data_id] = chunk
        turns: list[Turn] = []
        before: Message | None = None
        for m, item in wanted:
            first = first_chunks.get(item.id)
            if first is not None:
                turns.append(turn_of(m, before, item.id, first))
                before = m
        if not turns:
            return 0
        embedder, vectors = self.wiring.embedder, self.wiring.vectors
        embedded = embedder.embed([context_text(turn.context, turn.text) for turn in turns])
        vectors.ensure_collection(TURNS, embedder.dimension)
        vectors.upsert(target.scope, TURNS, turn_points(turns, embedded))
        return len(turns)

    def session_messages(
        self, messages: Sequence[Message], dataset: str | None, session_id: str
    ) -> list[str]:
        store = self._sessions()
        key = self.session_key(session_id)
        into = dataset or self.settings.dataset
        entries = [
            SessionEntry(
                kind="message",
                question=m.text,
                speaker=m.speaker,
                said_at=m.time,
                dataset=into,
                datasets=[into],
            )
            for m in messages
        ]
        for entry in entries:
            store.append(key, entry)
        return [entry.id for entry in entries]

    def _bridge(self, messages: Sequence[Message], dataset: str | None) -> None:
        added = self.add_messages(messages, dataset)
        self.cognify(dataset)
        self.index_turns(messages, added, dataset)

    def recall(
        self,
        query: str,
        datasets: Sequence[str] | None = None,
        session_id: str | None = None,
        type: str | SearchType = SearchType.CHUNKS,
        top_k: int = 10,
        options: Mapping[str, Any] | None = None,
    ) -> Recalled:
        """The session memory first (BM25 over its entries), then the graph; each result says which.

        With a session, the query and what the graph gave are appended to it as an entry
        (`Recalled.entry_id`): rate it with `add_feedback`, and `improve` moves those nodes' weights.
        """
        found: list[Recollection] = []
        unavailable = ""
        if session_id is not None:
            try:
                found = self._recall_session(session_id, query, top_k)
            except (ConfigError, StoreError) as error:
                # Short-term memory is down or off: the graph still answers, and says so.
                unavailable, session_id = f"session memory unavailable: {error}", None
        try:
            result = self.search(
                query, type, datasets=datasets, top_k=top_k, only_context=True, options=options
            )
        except InputError as error:
            if session_id is None:
                raise
            # The session answers while the background cognify has not made its dataset yet.
            result = SearchResult(
                query=query, type=SearchType(type), results=[], context="", notice=str(error)
            )
        graph = [graph_recollection(hit) for hit in result.results[:top_k]]
        notice = "; ".join(text for text in (unavailable, result.notice or "") if text)
        recalled = Recalled(query=query, results=found + graph, notice=notice)
        if session_id is not None:
            entry = recalled_entry(query, graph, result.context, self._readable(datasets))
            self._sessions().append(self.session_key(session_id), entry)
            recalled.entry_id = entry.id
        return recalled

    def _recall_session(self, session_id: str, query: str, top_k: int) -> list[Recollection]:
        entries = self.get_session(session_id)
        best = search_entries([entry for entry in entries if worth_recalling(entry)], query, top_k)
        return [session_recollection(entry, score) for entry, score in best]

    def add_feedback(self, session_id: str, entry_id: str, score: int, text: str = "") -> bool:
        """Rate a session entry 1-5 (with an optional comment); False when there is no such entry."""
        return self._sessions().add_feedback(self.session_key(session_id), entry_id, text, score)

    def delete_feedback(self, session_id: str, entry_id: str) -> bool:
        return self._sessions().delete_feedback(self.session_key(session_id), entry_id)

    def get_session(self, session_id: str, last_n: int | None = None) -> list[SessionEntry]:
        """The caller's session, oldest first: only the entries it may read every dataset of, now
        (`last_n`: of the newest n entries)."""
        return gate.visible(self.caller, self._sessions().get_session(self.session_key(session_id), last_n))

    def session_key(self, session_id: str) -> SessionKey:
        return SessionKey(tenant=self.caller.tenant, user=self.caller.user, session_id=session_id)

    def _sessions(self) -> SessionStore:
        store = self.wiring.sessions
        if store is None:
            raise ConfigError(
                "session memory is off (KENNING_SESSION_BACKEND=none): call without a session id"
            )
        return store

    @property
    def records(self) -> Records:
        """Memory records: create, list, get, update and delete data items as records."""
        return Records(self)

    def improve(self, dataset: str | None = None) -> Improvement:
        """Enrich a dataset's memory: remember its sessions' answered questions (rated 4-5 or
        unrated), move node weights by session feedback, and merge duplicate entities. Needs write.
        Only entries built from this dataset alone, by users who may write it now, count (see
        `session_entries`). Running it again with nothing new changes nothing."""
        target = self._readable_dataset(dataset)
        gate.require_write(self.caller, target.scope)
        added = self.add(session_items(self.wiring, target, self.caller), target.name).added
        if added:
            self.cognify(target.name)
        with held(self.wiring.lock, lock_name(target.scope), self.settings.lock_ttl_s):
            done = improve_held(self.wiring, target, self.settings.memify, self.caller)
        return done.model_copy(update={"session_items": len(added)})

    def forget(
        self,
        dataset: str | None = None,
        data_ids: Sequence[str] | None = None,
        *,
        everything: bool = False,
        memory_only: bool = False,
    ) -> list[Forgotten]:
        """Forget data items of a dataset, a whole dataset (no `data_ids`), or every dataset of the
        tenant (`everything`): from the graph, vectors, lexical index, metadata, cache, sessions and
        (unless `memory_only`) the stored bytes. Facts another item supports stay."""
        metadata = self.wiring.metadata
        if everything:
            targets = metadata.list_datasets(self.caller.tenant)
        else:
            targets = [find_dataset(metadata, self.caller.tenant, dataset or self.settings.dataset)]
        done = []
        for target in targets:
            ids = None if everything else data_ids
            done.append(forget_in_dataset(self.wiring, target, ids, memory_only, self.settings.lock_ttl_s))
        return done

    def estimate(self, dataset: str | None = None) -> Estimate:
        """LLM calls, tokens and cost the next cognify would spend; writes nothing."""
        self.dataset(dataset)
        settings = self.settings
        found = estimate(self.wiring, self.scope(dataset))
        return found.price(settings.llm_price_prompt_per_1k, settings.llm_price_completion_per_1k)

    def search(
        self,
        query: str,
        type: str | SearchType = SearchType.HYBRID_COMPLETION,
        *,
        datasets: Sequence[str] | None = None,
        top_k: int = 10,
        only_context: bool = False,
        session_id: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> SearchResult:
        # A dataset the caller may not read is left out, silently: no error tells it exists.
        scopes = [self.scope(name) for name in self._readable(datasets)]
        readable = [
            find_dataset(self.wiring.metadata, scope.tenant, scope.dataset, lambda d: self.may_read(d.scope))
            for scope in scopes
        ]
        if not scopes:
            return SearchResult(query=query, type=SearchType(type), results=[], context="")
        history = self._history(session_id) if session_id and not only_context else []
        request = SearchRequest(
            query=query,
            type=SearchType(type),
            scopes=scopes,
            top_k=top_k,
            only_context=only_context,
            session_id=session_id,
            principal=self.principal(),
            history=[exchange(entry) for entry in history],
            options=dict(options or {}),
        )
        with (
            timed_search(request.type.value),
            traced(self.settings.otel_endpoint, "kenning.search", type=request.type.value),
        ):
            result = self._faded(search(self.wiring, request), readable)
        if session_id is not None:
            # The answer read the datasets searched and those the history it was shown cites.
            read = [scope.dataset for scope in scopes] + [name for entry in history for name in entry.cited]
            self._remember_answer(session_id, result, list(dict.fromkeys(read)))
        return result

    def _readable(self, datasets: Sequence[str] | None) -> list[str]:
        """Those of the datasets named (default: KENNING_DATASET) the caller may read, in order."""
        names = dict.fromkeys(datasets or [self.settings.dataset])
        return [name for name in names if self.may_read(self.scope(name))]

    def _readable_dataset(self, name: str | None) -> Dataset:
        """The dataset, if the caller may read it; the same InputError for one missing or not its."""
        return find_dataset(
            self.wiring.metadata,
            self.caller.tenant,
            name or self.settings.dataset,
            lambda d: self.may_read(d.scope),
        )

    def _history(self, session_id: str) -> list[SessionEntry]:
        """The session's last exchanges the caller may read now, for a completion."""
        if not self.settings.session_history:
            return []
        try:
            entries = self.get_session(session_id)
        except (ConfigError, StoreError):
            return []  # no history is better than no answer; _remember_answer says why
        return [entry for entry in entries if worth_recalling(entry)][-self.settings.session_history :]

    def _remember_answer(self, session_id: str, result: SearchResult, datasets: list[str]) -> None:
        try:
            if result.answer:
                graph = [graph_recollection(hit) for hit in result.results]
                entry = recalled_entry(result.query, graph, result.context, datasets)
                answered = entry.model_copy(update={"answer": result.answer})
                self._sessions().append(self.session_key(session_id), answered)
            self.wiring.session_records.touch(self.session_key(session_id))
        except (ConfigError, StoreError) as error:
            result.notice = "; ".join(filter(None, (result.notice, f"session memory unavailable: {error}")))

    def _faded(self, result: SearchResult, searched: Sequence[Dataset]) -> SearchResult:
        """Decay applied to the hits, and their retrieval noted (in batches) for decay and prune."""
        datasets = {dataset.name: dataset for dataset in searched}
        faded = fade(result, datasets, self.wiring.access, self.wiring.metadata, self.settings.decay)
        for name, dataset in datasets.items():
            used = [hit.chunk_id for hit in faded.results if hit.dataset == name and hit.chunk_id]
            if used:
                self._accessed.note(dataset.id, used)
        return faded

    def prune(
        self, dataset: str | None = None, older_than_days: float | None = None, below: float | None = None
    ) -> Forgotten:
        """Forget the items not used (nor added) within `older_than_days`, or whose decay factor fell
        below `below` (needs KENNING_DECAY_HALF_LIFE_DAYS): cascading exactly like forget."""
        if older_than_days is None and below is None:
            raise ConfigError("prune needs older_than_days or below")
        self._accessed.flush()
        target = find_dataset(self.wiring.metadata, self.caller.tenant, dataset or self.settings.dataset)
        older = timedelta(days=older_than_days) if older_than_days is not None else None
        wiring = self.wiring
        decay = self.settings.decay
        stale = stale_items(target, wiring.metadata, wiring.chunks, wiring.access, older, below, decay)
        if not stale:
            return Forgotten()
        return forget_in_dataset(wiring, target, stale, False, self.settings.lock_ttl_s)

    def as_caller(self, caller: Caller) -> Kenning:
        """This memory as `caller` (a key's user, say) sees it: every read and write goes through
        its permissions. It shares these settings, stores and background work: close this one, not it."""
        view = Kenning(self.settings, self.wiring)
        view._caller, view._bridges, view._accessed = caller, self._bridges, self._accessed
        return view

    def may_read(self, scope: Scope) -> bool:
        return gate.may_read(self.caller, scope)

    def principal(self) -> Principal:
        """This caller as searches see it (see `gate.principal`)."""
        return gate.principal(self.caller, self.settings)

    def status(self, dataset: str | None = None) -> list[dict[str, Any]]:
        """Datasets with their items by status, recent runs and graph size.

        Each run, and each dataset over all its runs, has its LLM `tokens` ({prompt,
        completion}) and their `cost` at the settings' prices; a dataset also its `llm_calls`.
        """
        datasets = (
            [self.dataset(dataset)] if dataset else self.wiring.metadata.list_datasets(self.caller.tenant)
        )
        return [self._dataset_status(d.scope, d.id) for d in datasets]

    def _dataset_status(self, scope: Scope, dataset_id: str) -> dict[str, Any]:
        metadata = self.wiring.metadata
        close_dead_runs(metadata, dataset_id)
        items = metadata.list_items(dataset_id)
        runs = sorted(metadata.list_runs(dataset_id), key=lambda r: r.started_at, reverse=True)
        nodes, edges = self.wiring.graph.counts(scope)
        spent = self._spent(runs)
        total: Counter[str] = Counter()
        for run in runs:
            total.update(spent[run.id])
        return {
            "dataset": scope.dataset,
            "tenant": scope.tenant,
            "items": dict(Counter(item.status.value for item in items)),
            "errors": {item.name: item.error for item in items if item.status == ItemStatus.FAILED},
            "failed_chunks": self._failed_chunks(dataset_id, {item.id: item.name for item in items}),
            "graph": {"nodes": nodes, "edges": edges},
            "llm_calls": total["llm_calls"],
            **self._spend(total),
            "runs": [
                {
                    **run.model_dump(mode="json"),
                    **self._spend(spent[run.id]),
                    "llm_calls": spent[run.id]["llm_calls"],
                }
                for run in runs[:5]
            ],
        }

    def _spent(self, runs: Sequence[PipelineRun]) -> dict[str, dict[str, int]]:
        """Each run's LLM calls and tokens: every attempt recorded in the spend ledger (retries, and
        calls of tasks that were killed, included); the run's own counters for runs made before it."""
        ledger = self.wiring.spend.totals([run.id for run in runs])
        spent: dict[str, dict[str, int]] = {}
        for run in runs:
            counted = ledger.get(run.id)
            spent[run.id] = (
                {
                    "llm_calls": counted.calls,
                    "prompt_tokens": counted.prompt_tokens,
                    "completion_tokens": counted.completion_tokens,
                }
                if counted
                else {name: run.stats.get(name, 0) for name in SPEND_COUNTERS}
            )
        return spent

    def _failed_chunks(self, dataset_id: str, names: dict[str, str]) -> list[dict[str, Any]]:
        """Each chunk whose extraction failed: its item, position and the reason."""
        chunks = self.wiring.chunks
        failed = chunks.get_chunks(chunks.list_chunk_ids(dataset_id, ChunkStatus.FAILED))
        return [
            {"item": names.get(c.data_id, c.data_id), "chunk_id": c.id, "index": c.index, "error": c.error}
            for c in failed
        ]

    def _spend(self, stats: dict[str, int]) -> dict[str, Any]:
        prompt, completion = stats.get("prompt_tokens", 0), stats.get("completion_tokens", 0)
        settings = self.settings
        return {
            "tokens": {"prompt": prompt, "completion": completion},
            "cost": price(
                prompt, completion, settings.llm_price_prompt_per_1k, settings.llm_price_completion_per_1k
            ),
        }

    def started_jobs(self, dataset: str | None = None) -> list[Job]:
        """The runs now started, of the dataset or of every dataset of the tenant."""
        metadata = self.wiring.metadata
        datasets = metadata.list_datasets(self.caller.tenant)
        wanted = [d for d in datasets if not dataset or d.name == dataset]
        for d in wanted:
            close_dead_runs(metadata, d.id)
        return [
            Job(run_id=run.id, dataset_id=d.id, tenant=d.tenant, dataset=d.name)
            for d in wanted
            for run in metadata.list_runs(d.id)
            if run.status == RunStatus.STARTED
        ]

    def close(self) -> None:
        """Wait for background remembering to finish, then release every store."""
        for bridge in self._bridges:
            bridge.join()
        self._bridges.clear()
        self._accessed.flush()
        self._flush_spend()
        self.wiring.close()

    def __enter__(self) -> Kenning:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def turn_of(message: Message, before: Message | None, data_id: str, chunk: ChunkRecord) -> Turn:
    """A remembered message as a turn of its conversation, read after the message before it."""
    return Turn(
        data_id=data_id,
        chunk_id=chunk.id,
        document_id=chunk.document_id,
        text=message.as_text(),
        context=spoken(before) if before else "",
        spoken=spoken(message),
        speaker=message.speaker,
        said_at=message.time.isoformat() if message.time else "",
    )


def spoken(message: Message) -> str:
    """`speaker: text`, the words of a turn that gives the next one its context."""
    return f"{message.speaker}: {message.text}" if message.speaker else message.text


def message_source(message: Message, position: int) -> Source:
    """A message as a source: under its id when it has one (a new text under it replaces it)."""
    return text_source(message.as_text(), name=message.id or f"message {position}", external_id=message.id)


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


class Unlisted(Exception):
    """A bucket could not be listed (it is missing, or the credentials may not list it)."""


class Listed:
    """A bucket whose listing failures, other than transient ones, are `Unlisted`: told apart from
    a store's failure to take what was read, and never shown (they say whether the bucket exists)."""

    def __init__(self, source: ObjectSource) -> None:
        self._source = source

    def list_objects(self, prefix: str) -> Iterator[StoredObject]:
        try:
            yield from self._source.list_objects(prefix)
        except TransientStoreError:
            raise
        except StoreError as error:
            raise Unlisted(str(error)) from error

    def read(self, key: str, max_bytes: int) -> bytes:
        return self._source.read(key, max_bytes)


def batched(sources: Iterable[Source], size: int) -> Iterator[list[Source]]:
    """Bounded lists, so a large bucket is never held in memory whole."""
    iterator = iter(sources)
    while batch := list(islice(iterator, size)):
        yield batch


def _with_node_sets(source: Source, node_sets: Sequence[str]) -> Source:
    merged = list(dict.fromkeys([*source.node_sets, *node_sets]))
    return source.model_copy(update={"node_sets": merged})
