"""Fixtures for the contract suites: servers the adapters under test talk to."""

from __future__ import annotations

# The FalkorDB server fixture (`falkordb_url`) is shared with the integration tests: tests/conftest.py.
