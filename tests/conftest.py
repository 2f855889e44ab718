"""Shared fixtures: real PostgreSQL and Redis on 127.0.0.1, one fresh database per test session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.falkordb_server import falkordb_server
from tests.services import REDIS_URL, ensure_services, scratch_database

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A database of its own on the local PostgreSQL, dropped after the session."""
    with scratch_database() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> str:
    ensure_services()
    return REDIS_URL


@pytest.fixture
def key_prefix() -> str:
    """A prefix that keeps one test's Redis keys apart from every other's."""
    return f"kenning-test:{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="session")
def falkordb_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A FalkorDB server of this test session's own on 127.0.0.1, stopped at the end."""
    with falkordb_server(tmp_path_factory.mktemp("falkordb")) as url:
        yield url
