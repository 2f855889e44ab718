"""The query latency benchmark times searches the way an installed kenning runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.query_latency import cold_env


def test_a_timed_cold_search_keeps_bytecode_even_where_this_environment_turns_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an environment that turns bytecode off, as this machine's does
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    bytecode = tmp_path / "bytecode"
    # When a process starts with the environment of a timed search and imports a module
    env = cold_env(tmp_path / "home", bytecode)
    script = "import sys, kenning.pipeline.models; print(sys.dont_write_bytecode, sys.pycache_prefix)"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    # Then it writes the bytecode, under its own prefix, for the next search to read
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", str(bytecode)]
    assert list(bytecode.rglob("models*.pyc"))
    assert env["KENNING_HOME"] == str(tmp_path / "home")
