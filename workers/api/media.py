"""The media type of a request body, the same rule on every route: 415 for a body that is not
JSON where JSON is read."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from kenning.workers.api.errors import ApiError

JSON_ONLY = "send the body as application/json"


def is_json(content_type: str) -> bool:
    """`application/json` or `application/<anything>+json`, parameters aside."""
    kind = content_type.split(";")[0].strip().lower()
    main, _, sub = kind.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


async def require_json(request: Request) -> None:
    """415 for a request whose body is sent as something other than JSON (no content type is JSON)."""
    content_type = request.headers.get("content-type")
    if content_type is not None and not is_json(content_type) and await request.body():
        raise ApiError(415, "unsupported_media_type", JSON_ONLY)


class JsonRoute(APIRoute):
    """A route that reads a JSON body refuses one of another media type with 415, before its
    schema is checked (which would call a text body a schema error, 422)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def checked(request: Request) -> Response:
            await require_json(request)
            return await handler(request)

        return checked
