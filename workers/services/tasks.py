"""Tasks that other services send by name, with only `celery` installed.

Trust: whoever can publish to these queues is an operator of the deployment (no per-message
authentication; secure the broker). A request may name the tenant it acts as, but reads only
what this worker's `KENNING_READ_SCOPES` allow. Callers that are not fully trusted go through
the HTTP API or MCP, where an API key maps to a user and that user's grants.

Every task takes one JSON object and returns one JSON object (queues are
`<prefix>.<kind>`, prefix `KENNING_QUEUE_PREFIX`, default `kenning`):

- `kenning.add` (pipeline queue): `{"dataset", "tenant"?, "texts"?: [{"name", "text"}],
  "uris"?: ["s3://bucket/prefix"]}` -> `{"added", "unchanged", "skipped", "errors"}`
- `kenning.cognify` (pipeline queue): `{"dataset", "tenant"?}` -> `{"run_id"}`
- `kenning.remember` (pipeline queue): `{"dataset", "tenant"?, "session_id"?, "user"?, "messages":
  [{"speaker"?, "text", "time"?, "id"?}]}` -> `{"session_entries"?, "item_ids", "run_id"}`: with a
  session id the messages are in the session at once (shared by workers with
  `KENNING_SESSION_BACKEND=redis`); either way they are added and a cognify run is enqueued,
  not waited for (follow it with `kenning.run`)
- `kenning.run` (pipeline queue): `{"run_id"}` -> the run: `{"id", "status", "step",
  "error", "stats", "started_at", "finished_at"}`
- `kenning.maintenance` (pipeline queue; Celery beat runs it, see workers/runtime/schedule.py):
  `datasets`? -> `{"started": {dataset: run_id}}` for datasets with work left
- `kenning.forget` (load queue): `{"dataset", "tenant"?, "data_ids"?: [...], "memory_only"?}`
  -> `{"items", "nodes", "edges", "chunks", "blobs", "cache_entries", "reload_chunks"}`; under the
  dataset's run lock, so it never interleaves with a cognify of that dataset (retried while busy)
- `kenning.improve` (load queue; put it on the beat schedule): `datasets`? -> per dataset
  `{"weighted", "merged_entities", "repointed_edges", "session_items"}`
- `kenning.runs_list` (pipeline queue): `{"dataset"?, "tenant"?, "limit"?}` -> `{"runs": [{"id",
  "dataset", "status", "step", "error", "stalled", "stats", "started_at", "finished_at"}]}`, newest
  first; `stalled` says why a run not ended makes no progress (empty when it may)
- `kenning.runs_cancel` (pipeline queue): `{"run_id", "tenant"?, "reason"?}` -> the run, now
  `cancelled`: its dataset lock released, its tasks in flight stop at their next write
- `kenning.runs_retry` (pipeline queue): `{"run_id", "tenant"?}` -> `{"run_id"}` of a new run of
  the ended run's dataset, enqueued, which redoes only what is not done
- `kenning.search` (query queue): `{"query", "type"?, "datasets"?, "tenant"?, "top_k"?,
  "only_context"?}` -> `{"query", "type", "results", "context", "answer", "notice"}`

A request that does not validate fails the task with a `ValueError` naming the field.
Texts sent through `kenning.add` travel in the message, so keep them small (a few
hundred kilobytes each); put large corpora in a bucket and send its URI.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from kenning.pipeline.ingest import text_source
from kenning.pipeline.locking import LockBusy, lock_name
from kenning.pipeline.models import RUNNING, ChunkStatus, Dataset, ItemStatus
from kenning.pipeline.permission import Caller
from kenning.retrieval.contract import SearchType
from kenning.workers.application.lifecycle import (
    Message,
    find_dataset,
    forget_held,
    improve_held,
    session_items,
)
from kenning.workers.celery.app import app
from kenning.workers.control.runs import cancel_run, list_runs, retry_run
from kenning.workers.memory import Kenning

MAX_TEXT_CHARS = 1_000_000


class TextItem(BaseModel):
    name: str = "text"
    text: str = Field(max_length=MAX_TEXT_CHARS)


class AddRequest(BaseModel):
    dataset: str
    tenant: str | None = None
    texts: list[TextItem] = Field(default_factory=list)
    uris: list[str] = Field(default_factory=list)


class CognifyRequest(BaseModel):
    dataset: str
    tenant: str | None = None


class RememberRequest(BaseModel):
    dataset: str
    tenant: str | None = None
    session_id: str | None = Field(default=None, min_length=1)
    user: str | None = Field(default=None, min_length=1)
    messages: list[Message] = Field(min_length=1)


class RunRequest(BaseModel):
    run_id: str


class RunsRequest(BaseModel):
    dataset: str | None = None
    tenant: str | None = None
    limit: int = Field(default=20, ge=1, le=1000)


class RunControlRequest(BaseModel):
    run_id: str = Field(min_length=1)
    tenant: str | None = None
    reason: str = Field(default="", max_length=2000)


class RemoteSearch(BaseModel):
    query: str
    type: SearchType = SearchType.GRAPH_COMPLETION
    datasets: list[str] = Field(default_factory=list)
    tenant: str | None = None
    top_k: int = Field(default=10, ge=1, le=1000)
    only_context: bool = False


class ForgetRequest(BaseModel):
    dataset: str
    tenant: str | None = None
    data_ids: list[str] | None = None
    memory_only: bool = False


M = TypeVar("M", bound=BaseModel)


def _parse(model: type[M], request: Any) -> M:
    try:
        return model.model_validate(request)
    except ValidationError as error:
        raise ValueError(f"invalid {model.__name__}: {error}") from error


def _memory(tenant: str | None = None, user: str | None = None) -> Kenning:
    """The worker's stores, acting for the request's tenant and user (or the settings' ones): an
    operator of the deployment, who reads only what this worker's KENNING_READ_SCOPES allow."""
    resources = app.resources()
    settings = resources.settings
    caller = Caller(
        tenant=tenant or settings.tenant,
        user=user or settings.user,
        admin=True,
        scopes=tuple(settings.readable),
    )
    return Kenning(settings, resources.wiring).as_caller(caller)


def add_task(request: dict[str, Any]) -> dict[str, Any]:
    parsed = _parse(AddRequest, request)
    memory = _memory(parsed.tenant)
    result = memory.add([text_source(item.text, item.name) for item in parsed.texts], parsed.dataset)
    if parsed.uris:
        from_buckets = memory.add_paths(parsed.uris, parsed.dataset)
        result.added += from_buckets.added
        result.unchanged += from_buckets.unchanged
        result.skipped += from_buckets.skipped
        result.errors.update(from_buckets.errors)
    return {
        "added": len(result.added),
        "unchanged": len(result.unchanged),
        "skipped": len(result.skipped),
        "errors": result.errors,
    }


def cognify_task(request: dict[str, Any]) -> dict[str, Any]:
    from kenning.workers.celery.canvas import enqueue

    parsed = _parse(CognifyRequest, request)
    memory = _memory(parsed.tenant)
    job = enqueue(memory.wiring, memory.settings, memory.scope(parsed.dataset))
    return {"run_id": job.run_id}


def remember_task(request: dict[str, Any]) -> dict[str, Any]:
    from kenning.workers.celery.canvas import enqueue

    parsed = _parse(RememberRequest, request)
    memory = _memory(parsed.tenant, parsed.user)
    reply: dict[str, Any] = {}
    if parsed.session_id is not None:
        reply["session_entries"] = memory.session_messages(parsed.messages, parsed.dataset, parsed.session_id)
    items = memory.add_messages(parsed.messages, parsed.dataset)
    # The app keeps the worker's own settings; the scope carries the request's tenant.
    job = enqueue(memory.wiring, app.resources().settings, memory.scope(parsed.dataset))
    return {**reply, "item_ids": [item.id for item in items], "run_id": job.run_id}


def run_task(request: dict[str, Any]) -> dict[str, Any]:
    parsed, memory = _parse(RunRequest, request), _memory()
    run = memory.wiring.metadata.get_run(parsed.run_id)
    if run is None:
        raise ValueError(f"no pipeline run {parsed.run_id}")
    return run.model_dump(mode="json")


def runs_list_task(request: dict[str, Any]) -> dict[str, Any]:
    parsed = _parse(RunsRequest, request)
    runs = list_runs(_memory(parsed.tenant), parsed.dataset, parsed.limit)
    return {"runs": [run.model_dump(mode="json") for run in runs]}


def runs_cancel_task(request: dict[str, Any]) -> dict[str, Any]:
    parsed = _parse(RunControlRequest, request)
    return cancel_run(_memory(parsed.tenant), parsed.run_id, parsed.reason).model_dump(mode="json")


def runs_retry_task(request: dict[str, Any]) -> dict[str, Any]:
    from kenning.workers.celery.canvas import enqueue

    parsed = _parse(RunControlRequest, request)
    memory = _memory(parsed.tenant)
    settings = app.resources().settings

    def start(dataset: Dataset) -> str:
        return enqueue(memory.wiring, settings, dataset.scope).run_id

    return {"run_id": retry_run(memory, parsed.run_id, start)}


def search_task(request: dict[str, Any]) -> dict[str, Any]:
    parsed = _parse(RemoteSearch, request)
    memory = _memory(parsed.tenant)
    result = memory.search(
        parsed.query,
        parsed.type,
        datasets=parsed.datasets or None,
        top_k=parsed.top_k,
        only_context=parsed.only_context,
    )
    return result.model_dump(mode="json")


def forget_task(request: dict[str, Any]) -> dict[str, Any]:
    parsed = _parse(ForgetRequest, request)
    memory = _memory(parsed.tenant)
    dataset = find_dataset(memory.wiring.metadata, memory.caller.tenant, parsed.dataset)
    with run_lock(memory, dataset, "forget"):
        forgotten = forget_held(memory.wiring, dataset, parsed.data_ids, parsed.memory_only)
    return forgotten.model_dump()


def improve_task(datasets: list[str] | None = None) -> dict[str, Any]:
    """The scheduled enrichment (beat: a `kenning.improve` entry in KENNING_SCHEDULE): for each dataset
    of the tenant (or those named), rated session answers are added and a cognify run enqueued, and
    feedback weights and entity merges are applied under the dataset's run lock."""
    from kenning.workers.celery.canvas import enqueue

    memory = _memory()
    done: dict[str, Any] = {}
    for dataset in memory.wiring.metadata.list_datasets(memory.caller.tenant):
        if datasets and dataset.name not in datasets:
            continue
        added = memory.add(session_items(memory.wiring, dataset, memory.caller), dataset.name).added
        if added:
            enqueue(memory.wiring, memory.settings, dataset.scope)
        with run_lock(memory, dataset, "improve"):
            improved = improve_held(memory.wiring, dataset, memory.settings.memify, memory.caller)
        done[dataset.name] = improved.model_copy(update={"session_items": len(added)}).model_dump()
    return done


@contextmanager
def run_lock(memory: Kenning, dataset: Dataset, purpose: str) -> Iterator[None]:
    """The dataset's run lock for a task that is not a cognify run; LockBusy (retried) when taken."""
    lock, holder = app.resources().lock, f"{purpose}-{uuid.uuid4().hex}"
    name = lock_name(dataset.scope)
    if lock.take(name, holder, memory.settings.lock_ttl_s) is None:
        raise LockBusy(f"{name} is held by a run; {purpose} waits for it")
    try:
        yield
    finally:
        lock.release_run(name, holder)


def maintenance_task(datasets: list[str] | None = None) -> dict[str, Any]:
    """The scheduled job: start a cognify run for every dataset with work left and no run going.

    Work left is data never processed, or chunks whose extraction failed: after a
    provider outage, the next maintenance retries them with no manual clean-up.
    """
    from kenning.workers.celery.canvas import enqueue
    from kenning.workers.celery.supervisor import supervise

    memory = _memory()
    # Dead runs first: each is interrupted and resumed, so that its dataset counts as busy below.
    supervised = supervise(app.resources())
    metadata, chunks = memory.wiring.metadata, memory.wiring.chunks
    started: dict[str, str] = {}
    for dataset in metadata.list_datasets(memory.caller.tenant):
        if datasets and dataset.name not in datasets:
            continue
        busy = any(run.status in RUNNING for run in metadata.list_runs(dataset.id))
        waiting = any(
            metadata.list_items(dataset.id, status) for status in OPEN_ITEMS
        ) or chunks.list_chunk_ids(dataset.id, ChunkStatus.FAILED)
        if waiting and not busy:
            started[dataset.name] = enqueue(memory.wiring, memory.settings, dataset.scope).run_id
    return {"started": started, "supervised": supervised}


OPEN_ITEMS = (ItemStatus.PENDING, ItemStatus.CLASSIFIED, ItemStatus.CHUNKED)

app.task(add_task, name="kenning.add")
app.task(maintenance_task, name="kenning.maintenance")
app.task(cognify_task, name="kenning.cognify")
app.task(remember_task, name="kenning.remember")
app.task(run_task, name="kenning.run")
app.task(search_task, name="kenning.search")
app.task(runs_list_task, name="kenning.runs_list")
app.task(runs_cancel_task, name="kenning.runs_cancel")
app.task(runs_retry_task, name="kenning.runs_retry")
app.task(
    improve_task,
    name="kenning.improve",
    autoretry_for=(LockBusy,),
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=120,
)
app.task(
    forget_task,
    name="kenning.forget",
    autoretry_for=(LockBusy,),
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=120,
)
