"""The FastAPI app over one `Kenning`: `/v1` routes behind API keys, `/health` and `/ready` open.

Other endpoints mount on the app this returns: `app.include_router(router)` with routes that
take `Depends(authorized)` (kenning.workers.api.access) get the caller and its permissions.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kenning import __version__
from kenning.pipeline.errors import ConfigError, KenningError
from kenning.pipeline.models import Scope as DataScope
from kenning.workers.api.access import ApiState
from kenning.workers.api.docs import install_docs
from kenning.workers.api.errors import error_response, install_error_handlers
from kenning.workers.api.routes import router
from kenning.workers.api.runs import RunTracker
from kenning.workers.api.schemas import Readiness, Status
from kenning.workers.memory import Kenning
from kenning.workers.runtime.heap import settle
from kenning.workers.runtime.metrics import CONTENT_TYPE, metrics, wiring_llm
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring

MCP_PATH = "/mcp"
# uvicorn's logger: the one its configuration gives a handler, in the supervisor and each worker.
log = logging.getLogger("uvicorn.error")
# How `serve_workers` tells its worker processes what the command line said.
WORKER_OPTIONS = "KENNING_SERVE_OPTIONS"
DESCRIPTION = (
    "Long-term memory for AI agents. Every /v1 route needs an API key (`kenning key create`): "
    "`Authorization: Bearer <key>`. A caller sees the datasets it was granted, and nothing else."
)


def create_app(
    memory: Kenning, *, distributed: bool = False, host: str = "127.0.0.1", owned: bool = False
) -> FastAPI:
    """The app; `memory` stays the caller's to close, unless `owned`: then the app closes it
    when its lifespan ends. Cognify runs on the runner of the memory's mode (`KENNING_MODE`,
    which `distributed` must agree with: `serve --distributed` forces it in the memory's wiring):
    distributed, enqueued on the Celery workers; embedded, in a thread of this process. With the `mcp` extra,
    MCP over streamable HTTP answers at `/mcp` behind the same API keys (`host` is where the
    app listens: on a loopback one, MCP accepts only loopback Host and Origin headers)."""
    if distributed and not memory.wiring.distributed:
        raise ConfigError(
            "a distributed app needs a memory in distributed mode: Wiring(..., distributed=True)"
        )
    runs = RunTracker()
    mcp = _mcp_endpoint(memory, host)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        settle()
        try:
            async with AsyncExitStack() as stack:
                if mcp is not None:
                    await stack.enter_async_context(mcp.running())
                yield
        finally:
            try:
                await run_in_threadpool(runs.close)
            finally:
                if owned:
                    await run_in_threadpool(memory.close)

    app = FastAPI(
        title="kenning",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    install_docs(app)
    app.state.kenning = ApiState(memory=memory, runs=runs, distributed=distributed)
    install_error_handlers(app)
    metrics().watch_llm(lambda: wiring_llm(memory.wiring, memory.settings.llm_url))
    app.add_middleware(BodyLimit, limit=memory.settings.api_max_upload_bytes)
    app.add_middleware(Timed)
    app.include_router(router)
    if mcp is not None:
        # A plain route to the MCP app (its own path is MCP_PATH): no redirect to `/mcp/`.
        app.router.routes.append(Route(MCP_PATH, endpoint=mcp))

    @app.get("/health", response_model=Status, tags=["operations"])
    def health() -> Status:
        """Liveness: the process answers."""
        return Status(status="ok")

    @app.get(
        "/ready",
        response_model=Readiness,
        tags=["operations"],
        responses={503: {"model": Readiness, "description": "A store does not answer"}},
    )
    def ready() -> Readiness | JSONResponse:
        """Readiness: the metadata, graph and vector stores each answer a query; with the state
        of the LLM circuit breaker (an open one is reported, not a reason to be unready)."""
        stores = {name: _probe(check) for name, check in _store_checks(memory).items()}
        ok = all(answer == "ok" for answer in stores.values())
        body = Readiness(status="ready" if ok else "not_ready", stores=stores, llm_breaker=_breaker(memory))
        return body if ok else JSONResponse(body.model_dump(), status_code=503)

    @app.get(
        "/metrics",
        tags=["operations"],
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Metrics"}
        },
    )
    def prometheus() -> Response:
        """Prometheus metrics of this process: HTTP latency per route, search latency per type,
        runs and their steps, LLM calls, tokens and retries (empty without prometheus_client)."""
        return Response(metrics().exposition(), media_type=CONTENT_TYPE)

    return app


def _mcp_endpoint(memory: Kenning, host: str) -> McpEndpoint | None:
    """MCP over the memory's API keys, or None without the `mcp` extra."""
    try:
        from kenning.workers.mcp.server import http_app
    except ModuleNotFoundError:
        return None
    return McpEndpoint(lambda: http_app(memory, host=host, path=MCP_PATH))


class McpEndpoint:
    """The MCP app of the API app's current lifespan. A mounted app's own lifespan never runs, so
    its session manager runs in the API app's; and that manager runs once per instance, so each
    lifespan (an app may be started more than once) makes a fresh app."""

    def __init__(self, make: Callable[[], Starlette]) -> None:
        self.make = make
        self.app: Starlette | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        app = self.make()
        async with app.router.lifespan_context(app):
            self.app = app
            try:
                yield
            finally:
                self.app = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is None:
            response = error_response(503, "not_ready", "the app is not started (its lifespan did not run)")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _store_checks(memory: Kenning) -> dict[str, Callable[[], object]]:
    probe = DataScope(tenant="kenning-ready", dataset="kenning-ready")
    return {
        "metadata": memory.wiring.permissions.list_tenants,
        "graph": lambda: memory.wiring.graph.counts(probe),
        "vectors": memory.wiring.vectors.list_collections,
    }


def _probe(check: Callable[[], object]) -> str:
    try:
        check()
    except KenningError as error:
        return f"unreachable: {error}"
    return "ok"


def _breaker(memory: Kenning) -> str | None:
    """The LLM circuit breaker's state; none without an LLM endpoint."""
    found = wiring_llm(memory.wiring, memory.settings.llm_url)
    return found[1] if found else None


class Timed:
    """Record each HTTP request's latency by method, route template and status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            metrics().requested(scope["method"], route, status, time.perf_counter() - started)


class BodyTooLarge(HTTPException):
    """The request body went over the limit (raised while it is read, so the rest is never read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over the limit of {limit} bytes")


class BodyLimit:
    """At most `limit` bytes of request body: refused up front by Content-Length, else while read.
    Either way the answer is the API's 413, also on a mounted app (MCP) that reads the body itself."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self.refuse(scope, receive, send)
            return
        metered = MeteredBody(self.limit, receive, send)
        try:
            await self.app(scope, metered.receive, metered.send)
        except BodyTooLarge:
            if metered.started:
                raise
        if metered.refused and not metered.started:
            await self.refuse(scope, receive, send)

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response(413, "too_large", str(BodyTooLarge(self.limit).detail))(scope, receive, send)


class MeteredBody:
    """One request's body, counted as it is read: past the limit, reading raises `BodyTooLarge`,
    and what the app answers then is held back (unless it had started answering before)."""

    def __init__(self, limit: int, receive: Receive, send: Send) -> None:
        self.limit, self._receive, self._send = limit, receive, send
        self.received, self.refused, self.started = 0, False, False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.refused = True
                raise BodyTooLarge(self.limit)
        return message

    async def send(self, message: Message) -> None:
        if self.refused and not self.started:
            return  # whatever the app made of a body cut short: the 413 is the answer
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)


def serve_workers(host: str, port: int, workers: int, *, distributed: bool = False) -> None:
    """Answer HTTP on host:port with `workers` processes until interrupted (uvicorn's supervisor):
    each opens a `Kenning` of its own on the home of this environment's settings (`worker_app`).
    Bad settings or a port in use raise `ConfigError` before any worker starts; workers that
    cannot start stop the server, which then exits with uvicorn's startup-failure code (3)."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    load_settings()  # bad settings are told once, here, not by every worker in a restart loop
    os.environ[WORKER_OPTIONS] = json.dumps({"distributed": distributed, "host": host})
    target = f"{__name__}:{worker_app.__name__}"
    config = uvicorn.Config(target, factory=True, host=host, port=port, workers=workers, log_level="info")
    with listening_socket(host, port) as listener:
        shown = f"[{host}]" if ":" in host else host
        log.info("kenning serve: %d workers on http://%s:%d", workers, shown, port)
        supervisor = Multiprocess(config, sockets=[listener])
        supervisor.run()
    if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
        sys.exit(STARTUP_FAILURE)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port for worker processes to share; `ConfigError` if it cannot
    be. Made with its protocol named: asyncio sets TCP_NODELAY only on accepted sockets that say
    they are TCP, and one made without (as uvicorn's supervisor makes its own) leaves Nagle's
    algorithm on, which holds each keep-alive answer about 40 ms for the client's delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    listener.set_inheritable(True)
    return listener


def worker_app() -> FastAPI:
    """The app of one worker process of `serve_workers`, over a `Kenning` it owns. A worker that
    cannot open its memory exits with uvicorn's startup-failure code, which stops the server."""
    from uvicorn.config import STARTUP_FAILURE

    options = json.loads(os.environ.get(WORKER_OPTIONS, "{}"))
    distributed = bool(options.get("distributed", False))
    try:
        settings = load_settings()
        memory = Kenning(settings, Wiring(settings, distributed=distributed))
    except Exception:
        log.exception("kenning serve: a worker could not open its memory")
        sys.exit(STARTUP_FAILURE)
    try:
        return create_app(memory, distributed=distributed, host=options.get("host", "127.0.0.1"), owned=True)
    except BaseException:
        memory.close()
        raise


def serve(memory: Kenning, host: str, port: int, *, distributed: bool = False) -> None:
    """Answer HTTP on host:port until interrupted (uvicorn, one process); `memory` stays the caller's."""
    import uvicorn

    app = create_app(memory, distributed=distributed, host=host)
    uvicorn.run(app, host=host, port=port, log_level="info")
