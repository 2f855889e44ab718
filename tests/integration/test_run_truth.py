"""A run that did not do all its work says so: status, exit code, and each failure with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kenning.workers.cli import main
from kenning.workers.memory import Kenning
from kenning.workers.settings import load_settings
from kenning.workers.wiring import Wiring
from tests.twins import CountingExtractor


def test_failed_chunks_make_a_run_completed_with_errors(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    extractor = CountingExtractor(fail_on="REFUSE")
    with Kenning(settings, Wiring(settings, {"extractor": extractor})) as memory:
        memory.add_text("Ada Lovelace wrote the first program.", "d", name="good")
        memory.add_text("REFUSE to read this one.", "d", name="bad")
        run = memory.cognify("d")

        assert run.status.value == "completed_with_errors"
        assert "1 failed chunks" in run.error
        [status] = memory.status("d")
        [failed] = status["failed_chunks"]
        assert failed["item"] == "bad" and "refused" in failed["error"]
        # The good item is still memory
        assert memory.search("Ada", "CHUNKS", datasets=["d"]).results


def test_the_cli_exits_non_zero_and_status_lists_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    # An LLM endpoint nobody listens on: every extraction fails
    monkeypatch.setenv("KENNING_LLM_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("KENNING_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("KENNING_LLM_TIMEOUT_S", "2")
    note = tmp_path / "note.txt"
    note.write_text("Grace Hopper built a compiler.")
    runner = CliRunner()
    assert runner.invoke(main, ["add", str(note), "--dataset", "d"]).exit_code == 0

    cognified = runner.invoke(main, ["cognify", "--dataset", "d"])

    assert cognified.exit_code != 0 and "completed_with_errors" in cognified.output
    status = json.loads(runner.invoke(main, ["status", "--dataset", "d", "--json"]).output)["datasets"][0]
    assert status["runs"][0]["status"] == "completed_with_errors"
    assert status["failed_chunks"] and status["failed_chunks"][0]["item"] == "note.txt"
