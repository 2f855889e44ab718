"""Fixtures for the contract suites: servers the adapters under test talk to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.falkordb_server import falkordb_server


@pytest.fixture(scope="session")
def falkordb_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A FalkorDB server of this test session's own on 127.0.0.1, stopped at the end."""
    with falkordb_server(tmp_path_factory.mktemp("falkordb")) as url:
        yield url
