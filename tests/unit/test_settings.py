"""Bad settings stop the command line at startup with one line naming the variable, exit code 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kenning.pipeline.errors import ConfigError
from kenning.workers.cli.main import run
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

# (environment, the variable the error must name, a word of what it accepts)
BAD_VALUES = [
    ({"KENNING_READ_SCOPES": "foo"}, "KENNING_READ_SCOPES", "JSON"),
    ({"KENNING_READ_SCOPES": '["foo"]'}, "KENNING_READ_SCOPES", "tenant/dataset"),
    ({"KENNING_CYPHER_TENANTS": "acme"}, "KENNING_CYPHER_TENANTS", "JSON"),
    ({"KENNING_SCHEDULE": "hourly"}, "KENNING_SCHEDULE", "JSON"),
    ({"KENNING_METADATA_URL": "bogus://x"}, "KENNING_METADATA_URL", "postgresql"),
    ({"KENNING_METADATA_URL": "/tmp/kenning.db"}, "KENNING_METADATA_URL", "sqlite"),
    ({"KENNING_HOME": "/proc/nope"}, "KENNING_HOME", "no kenning home"),
    ({"KENNING_GRAPH_BACKEND": "neo4j"}, "KENNING_GRAPH_BACKEND", "falkordb"),
    (
        {"KENNING_GRAPH_BACKEND": "falkordb", "KENNING_GRAPH_URL": "bolt://127.0.0.1:1"},
        "KENNING_GRAPH_URL",
        "redis://",
    ),
    (
        {"KENNING_GRAPH_BACKEND": "memgraph", "KENNING_GRAPH_URL": "redis://127.0.0.1:1"},
        "KENNING_GRAPH_URL",
        "bolt://",
    ),
    ({"KENNING_GRAPH_BACKEND": "falkordb"}, "KENNING_GRAPH_URL", "redis://"),
    ({"KENNING_GRAPH_URL": "bogus://x"}, "KENNING_GRAPH_URL", "postgresql"),
    ({"KENNING_LLM_URL": "not-a-url"}, "KENNING_LLM_URL", "http"),
    ({"KENNING_QDRANT_URL": "not-a-url"}, "KENNING_QDRANT_URL", "http"),
    ({"KENNING_EMBEDDING_URL": "localhost:8080"}, "KENNING_EMBEDDING_URL", "http"),
    ({"KENNING_S3_ENDPOINT_URL": "minio"}, "KENNING_S3_ENDPOINT_URL", "http"),
    ({"KENNING_REDIS_URL": "http://127.0.0.1:6379"}, "KENNING_REDIS_URL", "redis://"),
    ({"KENNING_TENANT": ""}, "KENNING_TENANT", "name"),
    ({"KENNING_TENANT": "  "}, "KENNING_TENANT", "name"),
    ({"KENNING_DATASET": ""}, "KENNING_DATASET", "name"),
    ({"KENNING_EMBEDDING_PROVIDER": "magic"}, "KENNING_EMBEDDING_PROVIDER", "hash"),
    ({"KENNING_CHUNK_SIZE": "big"}, "KENNING_CHUNK_SIZE", "integer"),
    ({"KENNING_CONCURRENCY": "0"}, "KENNING_CONCURRENCY", "1"),
    ({"KENNING_TEMPORAL": "perhaps"}, "KENNING_TEMPORAL", "boolean"),
]


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in [name for name in os.environ if name.startswith("KENNING_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    return monkeypatch


def run_cli(monkeypatch: pytest.MonkeyPatch, *arguments: str) -> int:
    monkeypatch.setattr(sys, "argv", ["kenning", *arguments])
    with pytest.raises(SystemExit) as stopped:
        run()
    return int(stopped.value.code or 0)


@pytest.mark.parametrize(("environment", "variable", "accepts"), BAD_VALUES)
def test_a_bad_setting_is_one_line_naming_the_variable_and_exit_code_2(
    clean_environment: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    environment: dict[str, str],
    variable: str,
    accepts: str,
) -> None:
    # Given a bad value in the environment
    for name, value in environment.items():
        clean_environment.setenv(name, value)
    # When a command starts
    code = run_cli(clean_environment, "status")
    # Then it stops with one line naming the variable and what it accepts
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert variable in lines[0] and accepts in lines[0], lines[0]


def test_good_settings_start(
    clean_environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_environment.setenv("KENNING_READ_SCOPES", '["default/*", "shared/main"]')
    clean_environment.setenv("KENNING_LLM_URL", "http://127.0.0.1:9/v1")
    clean_environment.setenv("KENNING_GRAPH_URL", "sqlite:///graph.db")
    with Kenning(load_settings()) as memory:  # a kenning home: status reads one, it makes none
        memory.status()
    code = run_cli(clean_environment, "status", "--json")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"datasets": []' in out


def test_a_home_that_cannot_be_made_is_one_line_naming_the_variable(
    clean_environment: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Given a KENNING_HOME where no directory can be made, and a command that makes a home
    clean_environment.setenv("KENNING_HOME", "/proc/nope")
    (tmp_path / "note.txt").write_text("a note")
    code = run_cli(clean_environment, "add", str(tmp_path / "note.txt"))
    # Then it stops with one line naming the variable and what it needs
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "KENNING_HOME" in err and "writable directory" in err, err


def test_a_url_with_a_password_is_not_echoed(clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setenv("KENNING_METADATA_URL", "mysql://admin:hunter2@db/kenning")
    with pytest.raises(ConfigError, match="KENNING_METADATA_URL") as raised:
        load_settings()
    assert "hunter2" not in str(raised.value)
