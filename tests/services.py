"""Reach the real servers the tests use; start them when they are down, fail loudly when they cannot be."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN_URL = os.environ.get(
    "KENNING_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("KENNING_TEST_REDIS", "redis://127.0.0.1:6379/0")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_services() -> None:
    """Start PostgreSQL and Redis through the project's script when either is down."""
    if port_open(5432) and port_open(6379):
        return
    result = subprocess.run(["bash", str(ROOT / "scripts" / "services.sh")], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"test servers are not available: {result.stdout}{result.stderr}")


@contextmanager
def scratch_database(prefix: str = "kenning_test") -> Iterator[str]:
    """A new empty PostgreSQL database for the block, dropped after it; yields its URL."""
    ensure_services()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
