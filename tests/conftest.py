"""Shared fixtures: real PostgreSQL and Redis on 127.0.0.1, one fresh database per test session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.services import POSTGRES_ADMIN_URL, REDIS_URL, ensure_services

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A database of its own on the local PostgreSQL, dropped after the session."""
    ensure_services()
    name = f"kenning_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def redis_url() -> str:
    ensure_services()
    return REDIS_URL


@pytest.fixture
def key_prefix() -> str:
    """A prefix that keeps one test's Redis keys apart from every other's."""
    return f"kenning-test:{uuid.uuid4().hex[:8]}:"
