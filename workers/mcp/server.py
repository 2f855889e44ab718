"""The MCP server: memory as tools for agents, over stdio or streamable HTTP.

Tools: `remember`, `recall`, `forget`, `search`, `list_datasets` and `status`. Over stdio the
tools act as the process's own settings say (their tenant, user and read scopes): whoever starts
the process owns its data. Over HTTP every request must carry an API key
(`Authorization: Bearer <key>`, from `kenning key create`); a request without a valid one is
refused with 401 before it reaches the MCP session, and each tool acts as the key's caller, with
the same permissions as the HTTP API: remembering needs write, forgetting needs delete, and a
dataset the caller may not read gives nothing, never an error that tells it exists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult, ToolAnnotations
from pydantic import AfterValidator, BaseModel, Field, ValidationError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from kenning import __version__
from kenning.pipeline.errors import KenningError, NotFound
from kenning.pipeline.forget import Forgotten
from kenning.pipeline.models import Dataset
from kenning.pipeline.models import Scope as DataScope
from kenning.pipeline.names import MAX_NAME_CHARS, name_problem
from kenning.pipeline.permission import Caller, Permission, authenticate
from kenning.pipeline.session import SessionId
from kenning.pipeline.validity import Fact
from kenning.retrieval.contract import SearchResult, SearchType
from kenning.workers.application.gate import readable_datasets
from kenning.workers.application.lifecycle import Message, Recalled, Remembered
from kenning.workers.memory import Kenning
from kenning.workers.runtime.heap import settle

READ, WRITE, DELETE, _SHARE = Permission
MCP_PATH = "/mcp"
# Where the key check leaves the caller, in the ASGI scope's per-request state.
CALLER_KEY = "kenning.caller"
INSTRUCTIONS = (
    "Long-term memory. `remember` text or conversation messages into a dataset; `recall` what is "
    "known about a question (each result cites its source: a session entry, or a data item and "
    "chunk of the graph); `search` with any search type; `forget` data items or a whole dataset; "
    "`list_datasets` and `status` show what there is."
)

# The HTTP API's error shape: {"error": {"code", "message"}}.
UNAUTHORIZED = {"error": {"code": "unauthorized", "message": "send an API key: Authorization: Bearer <key>"}}
Authenticator = Callable[[str], Caller | None]
"""An API key -> the caller it stands for, or None for an unknown or revoked key."""


def _dataset_names(value: str | list[str] | None) -> str | list[str] | None:
    """The dataset name(s) as given; a ValueError naming the field for one that is not valid."""
    for name in [value] if isinstance(value, str) else value or []:
        problem = name_problem(name)
        if problem:
            raise ValueError(f"dataset {problem}")
    return value


DatasetArg = Annotated[
    str | None,
    Field(description="Dataset name (default: the server's default dataset)", max_length=MAX_NAME_CHARS),
    AfterValidator(_dataset_names),
]
DatasetsArg = Annotated[
    list[str] | None,
    Field(description="Dataset names (default: every dataset the caller may read)"),
    AfterValidator(_dataset_names),
]
SessionArg = SessionId | None
TopK = Annotated[int, Field(ge=1, le=1000, description="How many results")]
AsOf = Annotated[
    str | None,
    Field(
        max_length=40,
        description="Facts as they held at this moment (a year, YYYY-MM, a date or an ISO 8601 date "
        "and time); default: those that hold now",
    ),
]


class FactHistory(BaseModel):
    """An entity's facts (`history`)."""

    entity: str
    facts: list[Fact]


class DatasetInfo(BaseModel):
    """A dataset the caller holds a permission on."""

    name: str
    exists: bool = Field(description="False for a dataset granted but not created yet")
    permissions: list[Permission]


class DatasetList(BaseModel):
    datasets: list[DatasetInfo]


class Statuses(BaseModel):
    datasets: list[dict[str, Any]] = Field(
        description="Per dataset: items by status, errors, graph size, LLM calls, tokens, cost, recent runs"
    )


@dataclass(frozen=True)
class Scoped:
    """One tool call's caller, and the memory as that caller sees it."""

    caller: Caller
    memory: Kenning

    def require(self, permission: Permission, name: str | None) -> str:
        """The dataset's name, if the caller holds `permission` on it (see `Caller.check`)."""
        dataset = name or self.memory.settings.dataset
        self.caller.check(permission, dataset)
        return dataset

    def existing(self, permission: Permission, name: str | None) -> Dataset:
        """The dataset, which must exist and allow `permission`; NotFound for one it may not read."""
        dataset = self.require(permission, name)
        scope = DataScope(tenant=self.caller.tenant, dataset=dataset)
        found = self.memory.wiring.metadata.get_dataset(scope)
        if found is None:
            raise NotFound(f"no dataset {dataset!r}")
        return found

    def datasets(self) -> list[Dataset]:
        """The tenant's existing datasets the caller holds any permission on."""
        listed = self.memory.wiring.metadata.list_datasets(self.caller.tenant)
        return [d for d in listed if self.caller.permissions(d.name)]

    def readable(self, names: Sequence[str] | None) -> list[str]:
        """Those of `names` the caller may read (all it may read when None), silently."""
        return readable_datasets(self.caller, self.memory.wiring.metadata, names)

    def may_read(self, dataset: str) -> bool:
        """Session entries that name no dataset are the caller's own; others need read."""
        return not dataset or self.caller.may(READ, dataset)


class Server(MCPServer):
    """The SDK's server, whose answer to arguments that do not match a tool's schema names each
    argument and what is wrong with it, and nothing of the validator's own (its error types,
    the input echoed back, links to its documentation)."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as error:
            cause = error.__cause__
            if isinstance(cause, ValidationError):
                raise ToolError(f"invalid arguments for {name}: {argument_problems(cause)}") from cause
            raise


def argument_problems(error: ValidationError) -> str:
    """`argument: what is wrong` for each problem, without pydantic's decorations."""
    problems = []
    for problem in error.errors(include_url=False, include_input=False, include_context=False):
        where = ".".join(str(part) for part in problem["loc"]) or "arguments"
        problems.append(f"{where}: {problem['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)


def create_server(memory: Kenning) -> MCPServer:
    """The MCP server over `memory` (which stays the caller's to close), with its seven tools."""
    server: MCPServer = Server("kenning", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    tools = Tools(memory)
    server.add_tool(tools.remember, annotations=ToolAnnotations(destructiveHint=False, idempotentHint=True))
    server.add_tool(tools.recall, annotations=ToolAnnotations(readOnlyHint=False))
    server.add_tool(tools.search, annotations=ToolAnnotations(readOnlyHint=True))
    server.add_tool(tools.history, annotations=ToolAnnotations(readOnlyHint=True))
    server.add_tool(tools.forget, annotations=ToolAnnotations(destructiveHint=True, idempotentHint=True))
    server.add_tool(tools.list_datasets, annotations=ToolAnnotations(readOnlyHint=True))
    server.add_tool(tools.status, annotations=ToolAnnotations(readOnlyHint=True))
    return server


class Tools:
    """The tools; each acts as its request's caller (see the module's docstring)."""

    def __init__(self, memory: Kenning) -> None:
        self.memory = memory
        self.owner = memory.caller

    def scoped(self, ctx: Context) -> Scoped:
        request = ctx.request_context.request
        if request is None:  # stdio: the process's own settings decide
            return Scoped(self.owner, self.memory)
        caller = request.scope.get("state", {}).get(CALLER_KEY)
        if not isinstance(caller, Caller):  # an HTTP app built without the key check: refuse
            raise ToolError("unauthorized: send an API key (Authorization: Bearer <key>)")
        keyed = caller.model_copy(update={"keyed": True})  # whatever checked the key, it is a key's
        return Scoped(keyed, self.memory.as_caller(keyed))

    def remember(
        self,
        ctx: Context,
        data: Annotated[
            str | list[Message],
            Field(description="A text, or conversation messages ({speaker, text, time, id})"),
        ],
        dataset: DatasetArg = None,
        session_id: SessionArg = None,
    ) -> Remembered:
        """Make text or messages long-term memory. Without a session id: added and built into the
        graph now (the answer says the run's status). With one: written to the session at once,
        and into the graph in the background. Needs write on the dataset."""
        with ToolErrors():
            access = self.scoped(ctx)
            name = access.require(WRITE, dataset)
            return access.memory.remember(data, name, session_id)

    def recall(
        self,
        ctx: Context,
        query: Annotated[str, Field(min_length=1, description="What to recall")],
        datasets: DatasetsArg = None,
        session_id: SessionArg = None,
        type: Annotated[
            SearchType, Field(description="How to search; AUTO: as each dataset's contents call for")
        ] = SearchType.AUTO,
        top_k: TopK = 10,
        as_of: AsOf = None,
    ) -> Recalled:
        """What memory holds about a query: the `top_k` best of the session's entries (with a session
        id) and of the datasets' memory, in one list, best first (scores in [0, 1], higher is better;
        `searched` says how the datasets were searched). Each result cites its source: `entry_id`
        (session), or `data_id`, `document_id` and `chunk_id` (graph); a remembered message has its
        `speaker` and `said_at`. With a session id, the recall is added to the session."""
        with ToolErrors():
            access = self.scoped(ctx)
            names = access.readable(datasets)
            if not names and session_id is None:
                return Recalled(query=query, results=[])
            recalled = access.memory.recall(query, names or None, session_id, type, top_k, as_of=as_of)
            recalled.results = [hit for hit in recalled.results if access.may_read(hit.dataset)]
            return recalled

    def search(
        self,
        ctx: Context,
        query: Annotated[str, Field(min_length=1)],
        type: Annotated[
            SearchType, Field(description="Search type; completion types need an LLM endpoint")
        ] = SearchType.AUTO,
        datasets: DatasetsArg = None,
        top_k: TopK = 10,
        only_context: Annotated[bool, Field(description="Stop before the LLM: hits and context")] = False,
        as_of: AsOf = None,
    ) -> SearchResult:
        """Search memory with any search type: hits (each citing data_id, document_id, chunk_id),
        the context built from them, and an answer when an LLM is configured."""
        with ToolErrors():
            access = self.scoped(ctx)
            names = access.readable(datasets)
            if not names:
                return SearchResult(query=query, type=type, results=[], context="")
            return access.memory.search(
                query, type, datasets=names, top_k=top_k, only_context=only_context, as_of=as_of
            )

    def history(
        self,
        ctx: Context,
        entity: Annotated[
            str, Field(min_length=1, max_length=MAX_NAME_CHARS, description="The entity's name")
        ],
        dataset: DatasetArg = None,
        as_of: AsOf = None,
    ) -> FactHistory:
        """Every fact about an entity, retired ones too, oldest first: the periods each held (each
        bound with the data item that set it) and the data items that state it; with `as_of`, those
        that held then. Needs read on the dataset."""
        with ToolErrors():
            access = self.scoped(ctx)
            name = access.existing(READ, dataset).name
            return FactHistory(entity=entity, facts=access.memory.history(entity, name, as_of))

    def forget(
        self,
        ctx: Context,
        dataset: Annotated[str, Field(min_length=1, max_length=255, description="The dataset")],
        data_ids: Annotated[
            list[str] | None, Field(description="Only these data items (default: the whole dataset)")
        ] = None,
        memory_only: Annotated[bool, Field(description="Keep the stored bytes")] = False,
    ) -> Forgotten:
        """Forget data items of a dataset, or the whole dataset, from every store; facts that
        another item still supports stay. Needs delete on the dataset."""
        with ToolErrors():
            access = self.scoped(ctx)
            target = access.existing(DELETE, dataset)
            return access.memory.forget(target.name, data_ids or None, memory_only=memory_only)[0]

    def list_datasets(self, ctx: Context) -> DatasetList:
        """The datasets the caller holds a permission on, with those permissions."""
        with ToolErrors():
            access = self.scoped(ctx)
            caller = access.caller
            existing = {d.name for d in access.datasets()}
            names = sorted(existing | {name for name, held in caller.grants.items() if held})
            held = {name: sorted(caller.permissions(name)) for name in names}
            return DatasetList(
                datasets=[
                    DatasetInfo(name=name, exists=name in existing, permissions=permissions)
                    for name, permissions in held.items()
                    if permissions
                ]
            )

    def status(self, ctx: Context, dataset: DatasetArg = None) -> Statuses:
        """Each readable dataset (or the one named): items by status, failures with their
        reasons, graph size, LLM calls, tokens, cost and recent runs."""
        with ToolErrors():
            access = self.scoped(ctx)
            if dataset is not None:
                return Statuses(datasets=access.memory.status(access.existing(READ, dataset).name))
            readable = set(access.readable(None))
            return Statuses(datasets=[s for s in access.memory.status() if s["dataset"] in readable])


class ToolErrors:
    """Domain errors become tool errors the agent reads (`isError`, the message as text)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        if isinstance(error, KenningError):
            raise ToolError(str(error)) from error


class RequireKey:
    """Refuse HTTP requests without a valid API key (401); pass the key's caller on in the scope."""

    def __init__(self, app: ASGIApp, authenticate: Authenticator) -> None:
        self.app = app
        self.authenticate = authenticate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        caller = None
        if scheme.lower() == "bearer" and token.strip():
            caller = await anyio.to_thread.run_sync(self.authenticate, token.strip())
        if caller is None:
            response = JSONResponse(UNAUTHORIZED, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        state = {**scope.get("state", {}), CALLER_KEY: caller}
        await self.app({**scope, "state": state}, receive, send)


def http_app(
    memory: Kenning,
    authenticate_key: Authenticator | None = None,
    *,
    host: str = "127.0.0.1",
    path: str = MCP_PATH,
) -> Starlette:
    """The streamable HTTP app at `path`, behind API keys: by default the keys of `memory`'s
    permission store (`kenning key create`); pass `authenticate_key` to check keys another way.
    Mounted elsewhere, the app's lifespan must run (it starts the MCP session manager)."""
    check = authenticate_key or (lambda token: authenticate(memory.wiring.permissions, token))
    app = create_server(memory).streamable_http_app(streamable_http_path=path, host=host)
    app.add_middleware(RequireKey, authenticate=check)
    return app


def serve_stdio(memory: Kenning) -> None:
    """Answer MCP on stdin/stdout until the client closes them."""
    server = create_server(memory)
    settle()
    server.run("stdio")


def serve_http(memory: Kenning, host: str, port: int) -> None:
    """Answer MCP over streamable HTTP at http://host:port/mcp until interrupted."""
    import uvicorn

    app = http_app(memory, host=host)
    settle()
    uvicorn.run(app, host=host, port=port, log_level="warning")
