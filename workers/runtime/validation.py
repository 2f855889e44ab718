"""What each setting accepts, and a failed check as one line naming its `KENNING_*` variable.

A value that fails is described by its shape only (its scheme, say), never echoed: URLs carry
passwords, and a key pasted into the wrong variable must not end up in a terminal or a log.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_settings import NoDecode, SettingsError

from kenning.pipeline.errors import ConfigError

SQL_SCHEMES = ("sqlite", "postgresql")
GRAPH_SCHEMES = {
    "memgraph": ("bolt", "bolt+s", "bolt+ssc", "neo4j", "neo4j+s", "neo4j+ssc"),
    "falkordb": ("redis", "rediss", "unix"),
}
REDIS_SCHEMES = ("redis", "rediss", "unix")
MODES = ("embedded", "distributed")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def scheme_of(url: str) -> str:
    found = _SCHEME.match(url)
    return found.group(1).lower() if found else ""


def shape_of(url: str) -> str:
    scheme = scheme_of(url)
    return f"a {scheme}:// URL" if scheme else "a value with no scheme"


def http_url(value: str) -> str:
    if value and (scheme_of(value) not in ("http", "https") or not value.split("://", 1)[1].strip("/")):
        raise ValueError(
            f"expected an http:// or https:// URL (e.g. http://127.0.0.1:8000), got {shape_of(value)}"
        )
    return value


def sql_url(value: str) -> str:
    if value and scheme_of(value).split("+")[0] not in SQL_SCHEMES:
        raise ValueError(
            "expected a SQLAlchemy URL for SQLite or PostgreSQL (sqlite:///path/kenning.db, "
            f"postgresql+psycopg://user@host/db), got {shape_of(value)}"
        )
    return value


def redis_url(value: str) -> str:
    if scheme_of(value) not in REDIS_SCHEMES:
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got {shape_of(value)}")
    return value


def run_mode(value: object) -> object:
    """`embedded` or `distributed`; empty (not given) is left for the settings to derive."""
    if value not in ("", None, *MODES):
        shown = repr(value) if isinstance(value, str) and value.isidentifier() else "another value"
        raise ValueError(
            f"expected embedded or distributed (or nothing: derived from the stores), got {shown}"
        )
    return value


def derived_mode(qdrant_url: object, metadata_url: object) -> str:
    """`distributed` when nothing lives on the local disk: vectors on a Qdrant server and metadata
    in a server database; else `embedded`."""
    server_metadata = scheme_of(str(metadata_url or "")).split("+")[0] == "postgresql"
    return MODES[1] if qdrant_url and server_metadata else MODES[0]


def name(value: str) -> str:
    if not value.strip():
        raise ValueError("expected a non-empty name")
    return value


def scope_patterns(values: list[str]) -> list[str]:
    for pattern in values:
        # A pattern matches `tenant/dataset`: with neither a slash nor a wildcard it matches nothing.
        if not any(mark in pattern for mark in "/*?["):
            raise ValueError(f"expected tenant/dataset patterns such as acme/* or */main, got {pattern!r}")
    return values


class S3Grant(BaseModel):
    """One entry of KENNING_S3_ALLOW: the tenant whose callers may read under `s3://bucket/prefix`."""

    model_config = ConfigDict(frozen=True)

    bucket: str
    prefix: str = ""
    tenant: str


S3_ALLOW_SHAPE = "s3://bucket/prefix=tenant entries, comma separated (or a JSON list of them)"


def s3_allow(value: Any) -> list[S3Grant]:
    """`s3://bucket/prefix=tenant` entries, from a comma separated string or a JSON list."""
    if isinstance(value, str):
        text = value.strip()
        try:
            entries = json.loads(text) if text.startswith("[") else [p for p in text.split(",") if p.strip()]
        except json.JSONDecodeError:
            raise ValueError(f"not valid JSON; expected {S3_ALLOW_SHAPE}") from None
    else:
        entries = value
    if not isinstance(entries, list):
        raise ValueError(f"expected {S3_ALLOW_SHAPE}")
    return [entry if isinstance(entry, S3Grant) else s3_grant(entry, n) for n, entry in enumerate(entries, 1)]


def s3_grant(entry: Any, position: int) -> S3Grant:
    uri, _, tenant = str(entry).strip().rpartition("=")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket or not tenant.strip() or "/" in tenant:
        raise ValueError(f"entry {position} is not s3://bucket/prefix=tenant; expected {S3_ALLOW_SHAPE}")
    return S3Grant(bucket=bucket, prefix=prefix, tenant=tenant.strip())


def check_graph_url(backend: str, url: str) -> None:
    """The graph URL fits the backend: a SQL URL for `sql`, Bolt for Memgraph, Redis for FalkorDB."""
    if backend == "sql":
        try:
            sql_url(url)
        except ValueError as error:
            raise ValueError(f"KENNING_GRAPH_URL: {error}") from None
        return
    schemes = GRAPH_SCHEMES[backend]
    *first, last = [f"{scheme}://" for scheme in schemes]
    accepted = f"a {', '.join(first)} or {last} URL"
    if not url:
        raise ValueError(f"KENNING_GRAPH_URL: the {backend} graph backend needs a URL ({accepted})")
    if scheme_of(url) not in schemes:
        raise ValueError(
            f"KENNING_GRAPH_URL: the {backend} graph backend needs {accepted}, got {shape_of(url)}"
        )


def entity_types(value: Any) -> tuple[str, ...]:
    """Entity type names, from a comma separated string or a JSON list: at least one, each a word or
    words (letters, digits, spaces), duplicates dropped."""
    if isinstance(value, str):
        text = value.strip()
        try:
            found = json.loads(text) if text.startswith("[") else text.split(",")
        except json.JSONDecodeError:
            raise ValueError("not valid JSON; expected type names, comma separated") from None
    else:
        found = value
    if not isinstance(found, list | tuple):
        raise ValueError("expected type names, comma separated (or a JSON list)")
    names = [" ".join(str(name).split()) for name in found]
    names = [name for name in names if name]
    bad = [name for name in names if not all(char.isalnum() or char == " " for char in name)]
    if bad or not names:
        raise ValueError(f"expected type names of letters and digits, got {bad or 'none'}")
    return tuple(dict.fromkeys(names))


HttpUrl = Annotated[str, AfterValidator(http_url)]
SqlUrl = Annotated[str, AfterValidator(sql_url)]
RedisUrl = Annotated[str, AfterValidator(redis_url)]
Name = Annotated[str, AfterValidator(name)]
RunMode = Annotated[Literal["embedded", "distributed"], BeforeValidator(run_mode)]
ScopePatterns = Annotated[list[str], AfterValidator(scope_patterns)]
S3Allow = Annotated[list[S3Grant], NoDecode, BeforeValidator(s3_allow)]
EntityTypes = Annotated[tuple[str, ...], NoDecode, BeforeValidator(entity_types)]


def config_error(error: ValidationError | SettingsError, model: type[BaseModel]) -> ConfigError:
    """One ConfigError, on one line, naming each variable that failed and what it accepts."""
    if isinstance(error, SettingsError):
        return ConfigError(f"invalid settings: {_undecodable(error, model)}")
    return ConfigError("invalid settings: " + "; ".join(_problem(problem) for problem in error.errors()))


def _problem(problem: Any) -> str:
    message = str(problem["msg"]).removeprefix("Value error, ")
    variable = "_".join(str(part) for part in problem["loc"][:1]).upper()
    return f"KENNING_{variable}: {message}" if variable else message


def _undecodable(error: SettingsError, model: type[BaseModel]) -> str:
    # pydantic-settings says which field it could not decode only in its message.
    found = re.search(r'field "(\w+)"', str(error))
    field = model.model_fields.get(found.group(1)) if found else None
    if found is None or field is None:
        return str(error)
    shape = "a JSON object" if get_origin(field.annotation) is dict else "a JSON list"
    about = f" ({field.description})" if field.description else ""
    return f"KENNING_{found.group(1).upper()}: not valid JSON, expected {shape}{about}"
