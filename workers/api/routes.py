"""The `/v1` routes: add, cognify and runs, search, remember, recall, forget, sessions, records, datasets.

Each route checks the caller's permission on the dataset first, then calls the memory as that
caller. Reads of datasets it may not read give nothing (searches) or 404 (one object); writes
need write, forget and delete need delete, sharing needs share.
"""

from __future__ import annotations

import asyncio
import mimetypes
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import AfterValidator, TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from kenning.pipeline.errors import InputError, KenningError, NotFound, StoreError
from kenning.pipeline.forget import Forgotten
from kenning.pipeline.ingest import AddResult, Source, text_source
from kenning.pipeline.names import MAX_NAME_CHARS
from kenning.pipeline.permission import Permission, find_user
from kenning.pipeline.session import SessionEntry, SessionId, search_entries
from kenning.pipeline.validity import Fact
from kenning.retrieval.contract import SearchResult
from kenning.workers.api.access import Access, authorized
from kenning.workers.api.errors import ERROR_RESPONSES, ApiError, ErrorBody, ErrorDetail, problem_text
from kenning.workers.api.media import JsonRoute, is_json
from kenning.workers.api.runs import FINISHED, POLL_S
from kenning.workers.api.schemas import (
    MOMENT_RULE,
    NAME_PATTERN,
    Added,
    AddText,
    CancelIn,
    CognifyIn,
    DatasetName,
    Datasets,
    DatasetView,
    Done,
    Feedback,
    ForgetIn,
    GrantIn,
    Grants,
    Identifier,
    ItemView,
    Me,
    Moment,
    RecallIn,
    RecordIn,
    RecordText,
    RememberIn,
    RunList,
    RunView,
    SearchIn,
    valid_name,
)
from kenning.workers.application import sessions
from kenning.workers.application.lifecycle import Recalled, Recollection, Remembered
from kenning.workers.application.records import PAGE_LIMIT, MemoryRecord, Page
from kenning.workers.application.sessions import (
    SessionList,
    SessionSummary,
    session_recollection,
    worth_recalling,
)
from kenning.workers.control.graph_view import MAX_NODES, graph_html
from kenning.workers.control.runs import cancel_run, retry_target

READ, WRITE, DELETE, SHARE = Permission
KEEPALIVE_S = 15.0
T = TypeVar("T")
Caller = Annotated[Access, Depends(authorized)]
DatasetPath = Annotated[
    str,
    Path(min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN),
    AfterValidator(valid_name("dataset")),
]
DatasetQuery = Annotated[
    str | None,
    Query(min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN),
    AfterValidator(lambda value: value if value is None else valid_name("dataset")(value)),
]
UserPath = Annotated[
    str,
    Path(min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN),
    AfterValidator(valid_name("user")),
]
IdPath = Annotated[str, Path(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$")]
SessionPath = Annotated[SessionId, Path()]

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES, route_class=JsonRoute)


# Adding and cognifying

DATASET_FIELD: TypeAdapter[str] = TypeAdapter(DatasetName)
NODE_SET_FIELD: TypeAdapter[list[str]] = TypeAdapter(list[Identifier])
NODE_SET = TypeAdapter(Identifier).json_schema()
# A form field is text: one `node_sets` field is one node set, repeated fields are several.
MULTIPART_SCHEMA = {
    "type": "object",
    "properties": {
        "files": {"type": "array", "items": {"type": "string", "format": "binary"}, "minItems": 1},
        "dataset": DATASET_FIELD.json_schema(),
        "node_sets": {"anyOf": [NODE_SET, {"type": "array", "items": NODE_SET, "maxItems": 100}]},
    },
    "required": ["files"],
}
ADD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": AddText.model_json_schema()},
            "multipart/form-data": {"schema": MULTIPART_SCHEMA},
        },
    }
}


@router.post(
    "/add",
    tags=["memory"],
    response_model=Added,
    openapi_extra=ADD_BODY,
    summary="Add texts, files or s3:// URIs",
)
async def add(request: Request, access: Caller) -> Added:
    """JSON `{texts, uris, dataset, node_sets}`, or multipart/form-data with `files` (and `dataset`,
    `node_sets`). The request body is limited in size (`KENNING_API_MAX_UPLOAD_BYTES`)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        dataset, node_sets, sources = await _uploaded(request)
        uris: list[str] = []
    elif not kind or is_json(kind):
        try:
            body = AddText.model_validate_json(await request.body())
        except ValidationError as error:
            raise ApiError(422, "invalid_request", _problems(error, "body")) from error
        dataset, node_sets, uris = body.dataset, body.node_sets, body.uris
        sources = [text_source(text) for text in body.texts]
    else:
        raise ApiError(415, "unsupported_media_type", "send application/json or multipart/form-data")
    name = access.require(WRITE, dataset)
    result = await run_in_threadpool(_add, access, name, sources, uris, node_sets)
    return Added(
        dataset=name,
        added=[ItemView.of(item) for item in result.added],
        unchanged=[ItemView.of(item) for item in result.unchanged],
        superseded=[ItemView.of(item) for item in result.superseded],
        skipped=result.skipped,
        errors=result.errors,
    )


async def _uploaded(request: Request) -> tuple[str | None, list[str], list[Source]]:
    async with request.form() as form:
        named = form.getlist("dataset")
        if len(named) > 1:
            raise ApiError(422, "invalid_request", "dataset: name one dataset, not several")
        dataset = _form_field(DATASET_FIELD, "dataset", named[0]) if named else None
        node_sets = _form_field(NODE_SET_FIELD, "node_sets", form.getlist("node_sets"))
        files = [part for part in form.getlist("files") if isinstance(part, UploadFile)]
        if not files:
            raise ApiError(422, "invalid_request", "files: upload at least one file")
        sources = []
        for part in files:
            name = part.filename or "upload"
            mime = part.content_type or mimetypes.guess_type(name)[0] or ""
            sources.append(Source(name=name, uri=f"upload:{name}", data=await part.read(), mime=mime))
    return dataset, node_sets, sources


def _form_field(field: TypeAdapter[T], name: str, value: object) -> T:
    """A form field's value, or 422 naming the field."""
    try:
        return field.validate_python(value)
    except ValidationError as error:
        raise ApiError(422, "invalid_request", _problems(error, name)) from error


def _add(
    access: Access, dataset: str, sources: list[Source], uris: list[str], node_sets: list[str]
) -> AddResult:
    result = access.memory.add(sources, dataset, node_sets) if sources else AddResult()
    for uri in uris:
        try:
            fetched = access.memory.add_paths([uri], dataset, node_sets)
        except (InputError, StoreError) as error:  # that source is unreadable; the others proceed
            result.errors[uri] = str(error)
            continue
        result.added += fetched.added
        result.unchanged += fetched.unchanged
        result.superseded += fetched.superseded
        result.skipped += fetched.skipped
        result.errors.update(fetched.errors)
    return result


@router.post(
    "/cognify",
    tags=["runs"],
    response_model=RunView,
    status_code=202,
    responses={200: {"model": RunView, "description": "The run ended (`wait=true`)"}},
)
def cognify(
    access: Caller,
    response: Response,
    body: CognifyIn | None = None,
    wait: Annotated[bool, Query(description="Answer when the run has ended")] = False,
) -> RunView:
    """Start building the dataset's graph and vectors; answers at once with the run (202), or
    with `wait=true` when it has ended (200). Follow it at `/v1/runs/{id}` or `/v1/runs/{id}/events`."""
    dataset = access.existing(WRITE, body.dataset if body else None).name
    run_id = access.state.runs.start(access.memory, dataset, wait=wait)
    if wait:
        response.status_code = 200
    return access.state.runs.view(access.caller, access.memory, run_id)


@router.get("/runs/{run_id}", tags=["runs"], response_model=RunView)
def get_run(run_id: IdPath, access: Caller) -> RunView:
    """A run of a dataset the caller may read or write."""
    return access.state.runs.view(access.caller, access.memory, run_id)


@router.get("/runs", tags=["runs"], response_model=RunList)
def list_runs(
    access: Caller,
    dataset: DatasetQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> RunList:
    """The most recent runs, newest first, of the datasets the caller may read or write (or of the
    one named). A run not ended that nothing can work on says why in `stalled`."""
    return access.state.runs.recent(access.caller, access.memory, dataset, limit)


@router.post("/runs/{run_id}/cancel", tags=["runs"], response_model=RunView)
def cancel(run_id: IdPath, access: Caller, body: CancelIn | None = None) -> RunView:
    """End a run not ended (needs write): marked `cancelled` with the reason, its dataset lock
    released; its tasks in flight stop at their next write. 409 for a run that has ended."""
    _run_dataset(access, run_id, WRITE)
    with _run_state_conflict():
        cancel_run(access.memory, run_id, body.reason if body else "")
    return access.state.runs.view(access.caller, access.memory, run_id)


@router.post("/runs/{run_id}/retry", tags=["runs"], response_model=RunView, status_code=202)
def retry(run_id: IdPath, access: Caller) -> RunView:
    """Start a new run of an ended run's dataset (needs write), which redoes only what is not
    done; answers at once with the new run (202). 409 for a run that has not ended."""
    dataset = _run_dataset(access, run_id, WRITE)
    with _run_state_conflict():
        retry_target(access.memory, run_id)
    new_id = access.state.runs.start(access.memory, dataset)
    return access.state.runs.view(access.caller, access.memory, new_id)


@contextmanager
def _run_state_conflict() -> Iterator[None]:
    """A run in the wrong state for the action (cancel an ended one, retry one not ended) is a
    conflict with the run as it is (409), not a bad request."""
    try:
        yield
    except InputError as error:
        raise ApiError(409, "conflict", str(error)) from error


def _run_dataset(access: Access, run_id: str, permission: Permission) -> str:
    """The name of the run's dataset, which the caller must see (else 404) and hold `permission` on."""
    dataset = access.state.runs.view(access.caller, access.memory, run_id).dataset
    access.caller.check(permission, dataset)
    return dataset


def _event(name: str, payload: str, description: str) -> dict[str, Any]:
    """One kind of server-sent event: its name, and its data as JSON of a component schema."""
    return {
        "type": "object",
        "description": description,
        "properties": {
            "event": {"const": name},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {"$ref": f"#/components/schemas/{payload}"},
            },
        },
        "required": ["event", "data"],
    }


# Each event of the stream (OpenAPI 3.1: the schema of a text/event-stream is one event's).
RUN_EVENT = {
    "oneOf": [
        _event("progress", "RunView", "The run, each time it changes"),
        _event("end", "RunView", "The run, once it has ended; the stream ends with it"),
        _event("error", "ErrorBody", "The run or the caller's access to it went away; the stream ends"),
    ]
}


@router.get(
    "/runs/{run_id}/events",
    tags=["runs"],
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-sent events; a comment line (`: keep-alive`) every 15 s of quiet",
            "content": {"text/event-stream": {"schema": RUN_EVENT}},
        }
    },
)
async def run_events(run_id: IdPath, access: Caller) -> StreamingResponse:
    """Server-sent events: `progress` (the run, whenever it changes) until `end` (the run ended),
    or `error` when the run or the caller's access to it goes away; each event's data is JSON."""
    first = await run_in_threadpool(get_run, run_id, access)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(_events(run_id, access, first), media_type="text/event-stream", headers=headers)


async def _events(run_id: str, access: Access, view: RunView) -> AsyncIterator[str]:
    last, quiet = "", 0.0
    while True:
        payload = view.model_dump_json()
        if payload != last:
            yield f"event: progress\ndata: {payload}\n\n"
            last, quiet = payload, 0.0
        elif quiet >= KEEPALIVE_S:
            yield ": keep-alive\n\n"
            quiet = 0.0
        if view.status in FINISHED:
            yield f"event: end\ndata: {payload}\n\n"
            return
        await asyncio.sleep(POLL_S)
        quiet += POLL_S
        try:
            # The key and its grants are read again each time: revoked, the stream ends at once.
            access = await run_in_threadpool(access.refreshed)
            view = await run_in_threadpool(get_run, run_id, access)
        except ApiError as error:
            yield _error_event(error.code, error.message)
            return
        except KenningError as error:  # the run, or the caller's access to it, went away
            yield _error_event("not_found", str(error))
            return


def _error_event(code: str, message: str) -> str:
    body = ErrorBody(error=ErrorDetail(code=code, message=message))
    return f"event: error\ndata: {body.model_dump_json()}\n\n"


# Search and memory for agents


@router.post("/search", tags=["memory"], response_model=SearchResult)
def search(body: SearchIn, access: Caller) -> SearchResult:
    """Any search type over the datasets named (default: all the caller may read). Datasets it
    may not read are left out silently: they give nothing, never an error."""
    datasets = access.readable(body.datasets)
    if not datasets:
        return SearchResult(query=body.query, type=body.type, results=[], context="")
    return access.memory.search(
        body.query,
        body.type,
        datasets=datasets,
        top_k=body.top_k,
        only_context=body.only_context,
        session_id=body.session_id,
        as_of=body.as_of,
    )


@router.post("/remember", tags=["memory"], response_model=Remembered)
def remember(body: RememberIn, access: Caller) -> Remembered:
    """Without a session: add and cognify now. With one: into the session now, the graph later."""
    dataset = access.require(WRITE, body.dataset)
    return access.memory.remember(body.content(), dataset, body.session_id)


@router.post("/recall", tags=["memory"], response_model=Recalled)
def recall(body: RecallIn, access: Caller) -> Recalled:
    """The `top_k` best of the session's entries (with a session) and the memory, best first, scores in
    [0, 1]; every result cites its source."""
    datasets = access.readable(body.datasets)
    if not datasets:  # no graph to search: the session's entries alone, if any
        return Recalled(query=body.query, results=_from_session(access, body))
    recalled = access.memory.recall(
        body.query, datasets, body.session_id, body.type, body.top_k, as_of=body.as_of
    )
    recalled.results = [hit for hit in recalled.results if _readable(access, hit.dataset)]
    return recalled


def _from_session(access: Access, body: RecallIn) -> list[Recollection]:
    if body.session_id is None:
        return []
    with sessions.operation(access.memory.context, body.session_id):
        # The memory shows only the entries the caller may read every dataset of.
        entries = [entry for entry in access.memory.get_session(body.session_id) if worth_recalling(entry)]
        found = search_entries(entries, body.query, body.top_k)
    return [session_recollection(entry, score) for entry, score in found]


@router.get("/datasets/{dataset}/history", tags=["memory"], response_model=list[Fact])
def history(
    dataset: DatasetPath,
    access: Caller,
    entity: Annotated[str, Query(min_length=1, max_length=MAX_NAME_CHARS)],
    as_of: Annotated[Moment | None, Query(description=f"The facts that held then: {MOMENT_RULE}")] = None,
) -> list[Fact]:
    """Every fact about the entity named, retired ones too, oldest first: the periods it held (each
    bound with the data item that set it) and the data items that state it; with `as_of`, those
    that held then. Needs read; 404 for an entity the dataset does not have."""
    return access.memory.history(entity, access.existing(READ, dataset).name, as_of)


@router.post("/forget", tags=["memory"], response_model=Forgotten)
def forget(body: ForgetIn, access: Caller) -> Forgotten:
    """Forget data items of a dataset (`data_ids`), or the whole dataset; needs delete."""
    dataset = access.existing(DELETE, body.dataset)
    return access.memory.forget(dataset.name, body.data_ids, memory_only=body.memory_only)[0]


# Sessions


@router.get("/sessions", tags=["sessions"], response_model=SessionList)
def list_sessions(access: Caller) -> SessionList:
    """The caller's own sessions, the most recently used first, each with its state now (running:
    used in the last 5 minutes; idle; abandoned: unused for 30 minutes; ended), the LLM requests,
    tokens and cost its operations (search, recall, remember) spent, per model, and its errors."""
    return SessionList(sessions=sessions.summaries(access.memory.context))


@router.get("/sessions/{session_id}/record", tags=["sessions"], response_model=SessionSummary)
def get_session_record(session_id: SessionPath, access: Caller) -> SessionSummary:
    """One of the caller's sessions as `GET /v1/sessions` lists it; 404 when it has none."""
    return sessions.summary(access.memory.context, session_id)


@router.post("/sessions/{session_id}/end", tags=["sessions"], response_model=Done)
def end_session(session_id: SessionPath, access: Caller) -> Done:
    """Mark one of the caller's sessions ended (a later operation with it starts it again); 404
    when it has no record."""
    sessions.end(access.memory.context, session_id)
    return Done()


@router.get("/sessions/{session_id}", tags=["sessions"], response_model=list[SessionEntry])
def get_session(
    session_id: SessionPath, access: Caller, last_n: Annotated[int | None, Query(ge=1, le=10_000)] = None
) -> list[SessionEntry]:
    """The caller's own session: its entries, oldest first; only those built from datasets that
    it may all read now (`datasets`), so a grant revoked hides them at once."""
    return access.memory.get_session(session_id, last_n)


@router.post("/sessions/{session_id}/feedback", tags=["sessions"], response_model=Done)
def add_feedback(session_id: SessionPath, body: Feedback, access: Caller) -> Done:
    """Rate an entry of the caller's session 1-5; `improve` turns ratings into weights."""
    if not access.memory.add_feedback(session_id, body.entry_id, body.score, body.text):
        raise NotFound(f"session {session_id!r} has no entry {body.entry_id!r}")
    return Done()


@router.delete("/sessions/{session_id}/feedback/{entry_id}", tags=["sessions"], response_model=Done)
def delete_feedback(session_id: SessionPath, entry_id: IdPath, access: Caller) -> Done:
    if not access.memory.delete_feedback(session_id, entry_id):
        raise NotFound(f"session {session_id!r} has no entry {entry_id!r}")
    return Done()


# Memory records


@router.get("/records", tags=["records"], response_model=Page)
def list_records(
    access: Caller,
    dataset: DatasetQuery = None,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT)] = 50,
) -> Page:
    target = access.existing(READ, dataset)
    return access.memory.records.list(target.name, offset, limit)


@router.post("/records", tags=["records"], response_model=MemoryRecord, status_code=201)
def create_record(body: RecordIn, access: Caller) -> MemoryRecord:
    """Remember a text as a record (add and cognify); `external_id` names it for later updates."""
    dataset = access.require(WRITE, body.dataset)
    return access.memory.records.create(body.text, dataset, body.external_id)


@router.get("/records/{record_id}", tags=["records"], response_model=MemoryRecord)
def get_record(record_id: IdPath, access: Caller) -> MemoryRecord:
    """A record with the nodes and edges it produced."""
    return access.memory.records.get(record_id, _record_dataset(access, record_id, READ))


@router.put("/records/{record_id}", tags=["records"], response_model=MemoryRecord)
def update_record(record_id: IdPath, body: RecordText, access: Caller) -> MemoryRecord:
    """Replace the record's text: cognified now, and what only the old text said is forgotten."""
    return access.memory.records.update(record_id, body.text, _record_dataset(access, record_id, WRITE))


@router.delete("/records/{record_id}", tags=["records"], response_model=Done)
def delete_record(record_id: IdPath, access: Caller) -> Done:
    access.memory.records.delete(record_id, _record_dataset(access, record_id, DELETE))
    return Done()


def _record_dataset(access: Access, record_id: str, permission: Permission) -> str:
    """The record's dataset name; one NotFound for a record missing and one the caller may not read."""
    dataset_id = access.memory.records.dataset_id_of(record_id)
    try:
        if dataset_id is None:
            raise NotFound("no such record")
        dataset = access.dataset_by_id(dataset_id, *Permission)
    except NotFound:
        raise NotFound(f"no memory record {record_id!r}") from None
    access.caller.check(permission, dataset.name)
    return dataset.name


# Datasets and who may use them


@router.get("/datasets", tags=["datasets"], response_model=Datasets)
def list_datasets(access: Caller) -> Datasets:
    """Datasets the caller holds a permission on, with those permissions; granted ones not yet
    created are listed with `exists: false`."""
    caller = access.caller
    existing = {d.name: d for d in access.memory.wiring.metadata.list_datasets(access.tenant)}
    names = sorted(set(existing) | {name for name, held in caller.grants.items() if held})
    views = [
        DatasetView(
            name=name,
            exists=name in existing,
            created_at=existing[name].created_at if name in existing else None,
            permissions=sorted(caller.permissions(name)),
        )
        for name in names
        if caller.permissions(name)
    ]
    return Datasets(datasets=views)


@router.get(
    "/datasets/{dataset}/graph",
    tags=["datasets"],
    response_class=Response,
    responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}, "description": "A page"}},
)
def graph(
    dataset: DatasetPath,
    access: Caller,
    max_nodes: Annotated[int, Query(ge=1, le=MAX_NODES * 10)] = MAX_NODES,
) -> HTMLResponse:
    """The dataset's entities and relations as the graph view (`kenning visualize`): one HTML page
    with its script, style and data inline; needs read."""
    return HTMLResponse(graph_html(access.memory, dataset, max_nodes))


@router.get("/datasets/{dataset}/permissions", tags=["datasets"], response_model=Grants)
def get_grants(dataset: DatasetPath, access: Caller) -> Grants:
    """Who holds which permission on the dataset; needs share."""
    name = access.require(SHARE, dataset)
    return _grants(access, name)


@router.post("/datasets/{dataset}/permissions", tags=["datasets"], response_model=Grants)
def grant(dataset: DatasetPath, body: GrantIn, access: Caller) -> Grants:
    """Grant another user of the caller's tenant permissions on the dataset; needs share. One's own
    permissions are never changed; only an admin grants share; others grant only what they hold."""
    name = access.require(SHARE, dataset)
    access.caller.check_share(name, body.user, body.permissions)
    store = access.memory.wiring.permissions
    store.grant(find_user(store, access.tenant, body.user), name, body.permissions)
    return _grants(access, name)


@router.delete("/datasets/{dataset}/permissions/{user}", tags=["datasets"], response_model=Grants)
def revoke(
    dataset: DatasetPath,
    user: UserPath,
    access: Caller,
    permission: Annotated[list[Permission] | None, Query(description="Default: every permission")] = None,
) -> Grants:
    """Revoke another user's permissions on the dataset (by default, all the caller may revoke:
    an admin every one, others those they hold but share); needs share."""
    name = access.require(SHARE, dataset)
    wanted = permission or sorted(access.caller.shareable(name))
    access.caller.check_share(name, user, wanted)
    store = access.memory.wiring.permissions
    store.revoke(find_user(store, access.tenant, user), name, wanted)
    return _grants(access, name)


def _grants(access: Access, dataset: str) -> Grants:
    held = access.memory.wiring.permissions.grants_on(access.tenant, dataset)
    return Grants(dataset=dataset, grants={user: sorted(p) for user, p in sorted(held.items())})


@router.get("/me", tags=["datasets"], response_model=Me)
def me(access: Caller) -> Me:
    """The caller: tenant, user, whether an admin, and its grants."""
    caller = access.caller
    grants = {name: sorted(held) for name, held in sorted(caller.grants.items()) if held}
    return Me(tenant=caller.tenant, user=caller.user, admin=caller.admin, grants=grants)


def _readable(access: Access, dataset: str) -> bool:
    """A hit that names no dataset is the caller's own session's; others need read."""
    return not dataset or access.caller.may(READ, dataset)


def _problems(error: ValidationError, *field: str) -> str:
    return problem_text(error.errors(), *field)
