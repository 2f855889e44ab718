"""The FastAPI app over one `Kenning`: `/v1` routes behind API keys, `/health` and `/ready` open.

Other endpoints mount on the app this returns: `app.include_router(router)` with routes that
take `Depends(authorized)` (kenning.workers.api.access) get the caller and its permissions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kenning import __version__
from kenning.pipeline.errors import KenningError
from kenning.workers.api.access import ApiState
from kenning.workers.api.errors import ErrorBody, error_response, install_error_handlers
from kenning.workers.api.routes import router
from kenning.workers.api.runs import RunTracker
from kenning.workers.api.schemas import Status
from kenning.workers.memory import Kenning

DESCRIPTION = (
    "Long-term memory for AI agents. Every /v1 route needs an API key (`kenning key create`): "
    "`Authorization: Bearer <key>`. A caller sees the datasets it was granted, and nothing else."
)


def create_app(memory: Kenning, *, distributed: bool = False) -> FastAPI:
    """The app; `memory` stays the caller's to close. With `distributed`, cognify is enqueued
    on the Celery workers instead of running in a thread of this process."""
    runs = RunTracker(distributed=distributed)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(runs.close)

    app = FastAPI(title="kenning", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    app.state.kenning = ApiState(memory=memory, runs=runs, distributed=distributed)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=memory.settings.api_max_upload_bytes)
    app.include_router(router)

    @app.get("/health", response_model=Status, tags=["operations"])
    def health() -> Status:
        """Liveness: the process answers."""
        return Status(status="ok")

    @app.get(
        "/ready",
        response_model=Status,
        tags=["operations"],
        responses={503: {"model": ErrorBody, "description": "The metadata store is unreachable"}},
    )
    def ready() -> Status | JSONResponse:
        """Readiness: the metadata store answers a query."""
        try:
            memory.wiring.permissions.list_tenants()
        except KenningError as error:
            return error_response(503, "not_ready", f"the metadata store is unreachable: {error}")
        return Status(status="ready")

    return app


class BodyTooLarge(HTTPException):
    """The request body went over the limit (raised while it is read, so the rest is never read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over the limit of {limit} bytes")


class BodyLimit:
    """At most `limit` bytes of request body: refused up front by Content-Length, else while read."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            response = error_response(413, "too_large", str(BodyTooLarge(self.limit).detail))
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited, send)


def serve(memory: Kenning, host: str, port: int, *, distributed: bool = False) -> None:
    """Answer HTTP on host:port until interrupted (uvicorn, one process); `memory` stays the caller's."""
    import uvicorn

    uvicorn.run(create_app(memory, distributed=distributed), host=host, port=port, log_level="info")
