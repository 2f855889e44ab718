"""Error texts safe to raise, log, store and show: no credentials, no provider bodies at length."""

from __future__ import annotations

import re
from collections.abc import Iterable

# The user and password of a URL: what follows `scheme://` up to the last `@` before the path.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)[^/?#\s@]*(?:@[^/?#\s@]*)*@")
MAX_ERROR_CHARS = 200


def redact_url(text: str) -> str:
    """`text` with the userinfo (`user:password@`) of every URL in it taken out."""
    return _USERINFO.sub(r"\1", text)


def safe_error_text(text: str, secrets: Iterable[str] = (), limit: int = MAX_ERROR_CHARS) -> str:
    """A short summary of an error text: its first line, at most `limit` characters, with the
    userinfo of its URLs and every one of `secrets` (an API key) taken out."""
    lines = text.strip().splitlines()
    line = redact_url(lines[0] if lines else "")
    for secret in secrets:
        if secret:
            line = line.replace(secret, "***")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def provider_error(status: int, body: str, secrets: Iterable[str] = ()) -> str:
    """What an endpoint answered with an error status: the status and a short, safe first line."""
    summary = safe_error_text(body, secrets)
    return f"HTTP {status}" + (f": {summary}" if summary else "")
