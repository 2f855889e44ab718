"""The Python API: `Kenning`, a thin facade over the application modules (ingest, search, sessions,
conversation, lifecycle, status, records), each given one `Context`: the ports, the settings and
the caller the memory acts for."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kenning.pipeline.context import Job
from kenning.pipeline.errors import ConfigError, InputError, StoreError
from kenning.pipeline.estimate import Estimate
from kenning.pipeline.forget import Forgotten
from kenning.pipeline.ingest import AddResult, Source, text_source
from kenning.pipeline.memify import Improvement
from kenning.pipeline.models import DataItem, Dataset, PipelineRun, Scope
from kenning.pipeline.permission import Caller, Permission
from kenning.pipeline.session import SessionEntry, SessionKey
from kenning.pipeline.validity import Fact
from kenning.retrieval.contract import Principal, SearchResult, SearchType
from kenning.workers.application import conversation, gate, ingest, lifecycle, search, sessions, status
from kenning.workers.application.context import Context
from kenning.workers.application.decay import AccessBuffer
from kenning.workers.application.history import fact_history, moment_of
from kenning.workers.application.lifecycle import Message, Recalled, Recollection, Remembered, find_dataset
from kenning.workers.application.records import Records
from kenning.workers.application.sessions import SessionSummary
from kenning.workers.runtime.extras import needs_extra
from kenning.workers.runtime.local_runner import ProgressCallback, no_progress
from kenning.workers.runtime.settings import Settings, in_mode, load_settings
from kenning.workers.runtime.wiring import Wiring

if TYPE_CHECKING:
    from rich.console import Console

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

    @property
    def context(self) -> Context:
        """What every operation of this memory runs with: its ports, settings and caller."""
        return Context(self.wiring, self.settings, self.caller)

    def as_caller(self, caller: Caller) -> Kenning:
        """This memory as `caller` (a key's user, say) sees it: every read and write goes through
        its permissions. It shares these settings, stores and background work: close this one, not it."""
        view = Kenning(self.settings, self.wiring)
        view._caller, view._bridges, view._accessed = caller, self._bridges, self._accessed
        return view

    def scope(self, dataset: str | None = None) -> Scope:
        return self.context.scope(dataset)

    def may_read(self, scope: Scope) -> bool:
        return gate.may_read(self.caller, scope)

    def principal(self) -> Principal:
        """This caller as searches see it (see `gate.principal`)."""
        return gate.principal(self.caller, self.settings)

    # Adding and cognifying

    def add(
        self, sources: Sequence[Source], dataset: str | None = None, node_sets: Sequence[str] = ()
    ) -> AddResult:
        """Add the sources; `node_sets` name the subsets every one of them joins, besides their own."""
        return ingest.add_sources(self.context, sources, dataset, node_sets)

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
        return ingest.add_paths(self.context, paths, dataset, node_sets)

    def dataset(self, name: str | None = None) -> Dataset:
        """The tenant's dataset of that name (default: KENNING_DATASET); an InputError listing the
        datasets the caller holds a permission on when it does not exist. Only `add` creates
        datasets."""
        caller, wanted = self.caller, name or self.settings.dataset
        try:
            return find_dataset(self.wiring.metadata, caller.tenant, wanted)
        except InputError:  # raised again, listing only the datasets the caller may see

            def seen(dataset: Dataset) -> bool:
                scope = dataset.scope
                return gate.may_read(caller, scope) or any(gate.holds(caller, p, scope) for p in Permission)

            return find_dataset(self.wiring.metadata, caller.tenant, wanted, seen)

    def cognify(
        self,
        dataset: str | None = None,
        progress: ProgressCallback = no_progress,
        console: Console | None = None,
        *,
        run_id: str | None = None,
    ) -> PipelineRun:
        """Run the pipeline over the dataset's new and unfinished data, under its lock; needs write.

        The mode decides where: in this process (embedded; `progress` is called as work advances,
        and `run_id` names the run, for a caller that gave it out before the run began), or on the
        Celery workers (distributed; the run is followed until it ends, its progress drawn on
        `console` when one is given)."""
        scope = self.dataset(dataset).scope
        gate.require_write(self.caller, scope)
        try:
            if self.wiring.distributed:
                from rich.console import Console

                with needs_extra("cognify in distributed mode"):
                    from kenning.workers.celery.canvas import cognify_distributed

                return cognify_distributed(self.wiring, scope, console or Console(quiet=True))
            return self.wiring.runner(progress).run(scope, run_id=run_id)
        finally:
            self._flush_spend()

    def _flush_spend(self) -> None:
        """Write the spend held while the metadata database was away: a run's spend is whole when
        it returns. Still away: logged, not raised; bookkeeping does not fail work that is done."""
        try:
            self.wiring.flush_spend()
        except StoreError as error:
            log.error("LLM spend still held, not written (%d writes): %s", self.wiring.spend.held, error)

    def estimate(self, dataset: str | None = None) -> Estimate:
        """LLM calls, tokens and cost the next cognify would spend; writes nothing."""
        self.dataset(dataset)
        return status.cost_estimate(self.context, dataset)

    # Memory for agents

    def remember(
        self,
        data: str | Sequence[Message | dict[str, Any]],
        dataset: str | None = None,
        session_id: str | None = None,
        *,
        progress: ProgressCallback = no_progress,
        detached: bool = False,
        time: datetime | None = None,
    ) -> Remembered:
        """Make text or conversation messages memory. Without a session: add, then cognify, now
        (`progress` called as it advances). With one: written to the session at once, and into
        the graph by a background cognify on a thread of this process; `detached`: added now,
        and the rest (`make_memory`) left to the caller, to run in another process, say. Either
        way `item_ids` are the ids of the items the messages are, or become. `time`: when the
        messages that give none were said (their facts hold from then: `history`)."""
        if isinstance(data, str):
            data = [Message(text=data)]
        messages = [Message.model_validate(message) for message in data]
        if time is not None:
            messages = [m if m.time else m.model_copy(update={"time": time}) for m in messages]
        if session_id is None:
            added = self.add_messages(messages, dataset)
            run = self.cognify(dataset, progress)
            self.index_turns(messages, added, dataset)
            return Remembered(item_ids=[i.id for i in added], run_id=run.id, status=run.status.value)
        gate.require_write(self.caller, self.scope(dataset))
        with sessions.operation(self.context, session_id):
            entries = self.session_messages(messages, dataset, session_id)
            item_ids = conversation.message_item_ids(self.context, messages, dataset)
            if detached:
                self.add_messages(messages, dataset)
        if not detached:
            bridge = threading.Thread(
                target=self.make_memory, args=(messages, dataset, session_id), name="kenning-remember"
            )
            bridge.start()
            self._bridges.append(bridge)
        return Remembered(status="queued", item_ids=item_ids, session_entries=entries)

    def add_messages(self, messages: Sequence[Message], dataset: str | None) -> list[DataItem]:
        return conversation.add_messages(self.context, messages, dataset)

    def index_turns(self, messages: Sequence[Message], items: Sequence[DataItem], dataset: str | None) -> int:
        """Index the messages as the turns of one conversation (see `conversation.index_turns`)."""
        return conversation.index_turns(self.context, messages, items, dataset)

    def session_messages(
        self, messages: Sequence[Message], dataset: str | None, session_id: str
    ) -> list[str]:
        return sessions.write_messages(self.context, messages, dataset, session_id)

    def make_memory(
        self, messages: Sequence[Message], dataset: str | None, session_id: str, *, added: bool = False
    ) -> None:
        """What a remember with a session does after it returns: add the messages, cognify, and
        index them as the turns of one conversation. `added`: a detached remember added them
        already; only those still there are made memory (a forget in between is not undone)."""
        if added:
            added_items = self._still_added(messages, dataset)
            if not added_items:
                return
        else:
            added_items = self.add_messages(messages, dataset)
        run = self.cognify(dataset)
        # The run this remember started is the session's spend; a failed one, its error.
        sessions.charge_run(self.context, session_id, run.id)
        if run.error:
            sessions.touch(self.context, self.session_key(session_id), run.error)
        self.index_turns(messages, added_items, dataset)

    def _still_added(self, messages: Sequence[Message], dataset: str | None) -> list[DataItem]:
        return self.wiring.metadata.get_items(conversation.message_item_ids(self.context, messages, dataset))

    def recall(
        self,
        query: str,
        datasets: Sequence[str] | None = None,
        session_id: str | None = None,
        type: str | SearchType = SearchType.AUTO,
        top_k: int = 10,
        options: Mapping[str, Any] | None = None,
        as_of: str | None = None,
    ) -> Recalled:
        """The `top_k` best of the session's entries (BM25) and the datasets' memory (by `type`; AUTO:
        the search what each dataset holds calls for), best first; each result says its source. Every
        score is in [0, 1], higher is better, and a remembered message has its speaker and time.

        With a session, the query and what the graph gave are appended to it as an entry
        (`Recalled.entry_id`): rate it with `add_feedback`, and `improve` moves those nodes' weights.
        Facts are those that hold now, or those that held `as_of` a moment (a year, YYYY-MM, a date
        or an ISO 8601 date and time).
        """
        kind = search_type(type)
        moment = moment_of(as_of)
        with sessions.operation(self.context, session_id):
            return self._recall(query, datasets, session_id, kind, top_k, options, moment)

    def _recall(
        self,
        query: str,
        datasets: Sequence[str] | None,
        session_id: str | None,
        type: str | SearchType,
        top_k: int,
        options: Mapping[str, Any] | None,
        as_of: str | None = None,
    ) -> Recalled:
        found: list[Recollection] = []
        unavailable = ""
        if session_id is not None:
            try:
                found = sessions.recall(self.context, session_id, query, top_k)
            except (ConfigError, StoreError) as error:
                # Short-term memory is down or off: the graph still answers, and says so.
                unavailable, session_id = f"session memory unavailable: {error}", None
        try:
            result = self.search(
                query, type, datasets=datasets, top_k=top_k, only_context=True, options=options, as_of=as_of
            )
        except InputError as error:
            if not found:
                raise
            # The session answers while the background cognify has not made its dataset yet.
            result = SearchResult(
                query=query, type=SearchType(type), results=[], context="", notice=str(error)
            )
        graph = [sessions.graph_recollection(hit) for hit in result.results[:top_k]]
        notice = "; ".join(text for text in (unavailable, result.notice or "") if text)
        best = sorted(found + graph, key=lambda recollection: -recollection.score)[:top_k]
        recalled = Recalled(query=query, results=best, searched=result.searched, notice=notice)
        if session_id is not None:
            read = search.readable(self.context, datasets)
            entry = sessions.recalled_entry(query, graph, result.context, read)
            self.context.sessions().append(self.session_key(session_id), entry)
            recalled.entry_id = entry.id
        return recalled

    def add_feedback(self, session_id: str, entry_id: str, score: int, text: str = "") -> bool:
        """Rate a session entry 1-5 (with an optional comment); False when there is no such entry."""
        return self.context.sessions().add_feedback(self.session_key(session_id), entry_id, text, score)

    def delete_feedback(self, session_id: str, entry_id: str) -> bool:
        return self.context.sessions().delete_feedback(self.session_key(session_id), entry_id)

    def get_session(self, session_id: str, last_n: int | None = None) -> list[SessionEntry]:
        """The caller's session, oldest first: only the entries it may read every dataset of, now
        (`last_n`: of the newest n entries)."""
        return sessions.entries(self.context, session_id, last_n)

    def list_sessions(self) -> list[SessionSummary]:
        """The caller's sessions, the most recently used first: each with its state now, the LLM
        requests, tokens and cost its operations spent (per model, from the spend ledger) and its
        errors."""
        return sessions.summaries(self.context)

    def session_summary(self, session_id: str) -> SessionSummary:
        """One of the caller's sessions as `list_sessions` shows it; NotFound when it has none."""
        return sessions.summary(self.context, session_id)

    def session_key(self, session_id: str) -> SessionKey:
        return self.context.session_key(session_id)

    @property
    def records(self) -> Records:
        """Memory records: create, list, get, update and delete data items as records."""
        return Records(self)

    def improve(self, dataset: str | None = None) -> Improvement:
        """Enrich a dataset's memory: remember its sessions' answered questions (rated 4-5 or
        unrated), move node weights by session feedback, and merge duplicate entities. Needs write.
        Only entries built from this dataset alone, by users who may write it now, count (see
        `session_entries`). Running it again with nothing new changes nothing."""
        return lifecycle.improve(self.context, dataset, self.cognify)

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
        (unless `memory_only`) the stored bytes. Facts another item supports stay. Needs delete."""
        self._join_bridges()  # a message still being remembered here would come back after it
        return lifecycle.forget(self.context, dataset, data_ids, everything, memory_only)

    def prune(
        self, dataset: str | None = None, older_than_days: float | None = None, below: float | None = None
    ) -> Forgotten:
        """Forget the items not used (nor added) within `older_than_days`, or whose decay factor fell
        below `below` (needs KENNING_DECAY_HALF_LIFE_DAYS): cascading exactly like forget."""
        if below is not None and self.settings.decay.half_life_days <= 0:
            raise ConfigError(
                "pruning below a decay factor needs decay on: set KENNING_DECAY_HALF_LIFE_DAYS (now 0, off)"
            )
        return lifecycle.prune(self.context, self._accessed, dataset, older_than_days, below)

    # Search and status

    def search(
        self,
        query: str,
        type: str | SearchType = SearchType.AUTO,
        *,
        datasets: Sequence[str] | None = None,
        top_k: int = 10,
        only_context: bool = False,
        session_id: str | None = None,
        options: Mapping[str, Any] | None = None,
        as_of: str | None = None,
    ) -> SearchResult:
        """Answer the query from the datasets the caller may read (others are left out silently);
        with a session, its history is given to a completion and the answer is kept in it. Facts
        are those that hold now, or those that held `as_of` a moment (see `recall`)."""
        return search.search(
            self.context,
            self._accessed,
            query,
            search_type(type),
            datasets=datasets,
            top_k=top_k,
            only_context=only_context,
            session_id=session_id,
            options=options,
            as_of=moment_of(as_of),
        )

    def history(self, entity: str, dataset: str | None = None, as_of: str | None = None) -> list[Fact]:
        """Every fact about the entity named, retired ones too, oldest first: when each held (its
        periods, each bound with the data item that set it) and the data items that state it; with
        `as_of`, those that held then. NotFound when the dataset has no such entity."""
        return fact_history(self.context, entity, dataset, as_of)

    def status(self, dataset: str | None = None) -> list[dict[str, Any]]:
        """Datasets the caller may read, with their items by status, recent runs and graph size.

        Each run, and each dataset over all its runs, has its LLM `tokens` ({prompt,
        completion}) and their `cost` at the settings' prices; a dataset also its `llm_calls`.
        A search of several datasets is in the figures of each (see `spend_total`).
        """
        return status.status(self.context, dataset)

    def spend_total(self, dataset: str | None = None) -> dict[str, Any]:
        """The `llm_calls`, `tokens` and `cost` of the datasets `status` shows, each LLM request
        counted once: what the provider billed for them."""
        return status.total(self.context, dataset)

    def started_jobs(self, dataset: str | None = None) -> list[Job]:
        """The runs now started, of the dataset or of every dataset of the tenant."""
        return status.started_jobs(self.context, dataset)

    def close(self) -> None:
        """Wait for background remembering to finish, then release every store."""
        self._join_bridges()
        self._accessed.flush()
        self._flush_spend()
        self.wiring.close()

    def _join_bridges(self) -> None:
        """Wait for the messages this memory is remembering in the background."""
        for bridge in list(self._bridges):
            bridge.join()
            self._bridges.remove(bridge)

    def __enter__(self) -> Kenning:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def search_type(value: str | SearchType) -> SearchType:
    """The search type named (in any case); InputError listing the types there are otherwise."""
    try:
        return SearchType(str(value).upper())
    except ValueError:
        known = ", ".join(t.value for t in SearchType)
        raise InputError(f"no search type {str(value)!r} (types: {known})") from None
