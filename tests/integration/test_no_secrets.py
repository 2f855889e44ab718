"""What a failing LLM leaves behind (chunk errors, status, a completion's error) holds no credentials.

Embedded mode, in process, through the CLI; the LLM is the simulator, or a closed port, reached
through a URL that carries a user and password, with an API key configured.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kenning.pipeline.models import ChunkStatus
from kenning.pipeline.redact import MAX_ERROR_CHARS
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.simulator import Simulator

SECRET = "s3cr3t-pass"
MARKER = "REFUSE-THIS"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("KENNING_LLM_API_KEY", f"sk-key-{SECRET}")
    monkeypatch.setenv("KENNING_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("KENNING_LLM_BREAKER_FAILURES", "1")
    return tmp_path


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://user:{SECRET}@")


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_a_refused_chunk_is_stored_with_a_short_error_and_status_shows_no_credentials(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an LLM that refuses one text with a long body echoing its URL and the API key
    refusal = f"refused at http://user:{SECRET}@127.0.0.1/v1 for key sk-key-{SECRET}: " + "z" * 50_000
    (env / "refused.txt").write_text(f"Ada Lovelace wrote {MARKER} notes on the engine.")
    (env / "fine.txt").write_text("Charles Babbage designed the Analytical Engine.")
    with Simulator(fail_on=MARKER, refusal=refusal) as simulator:
        monkeypatch.setenv("KENNING_LLM_URL", with_credentials(simulator.base_url))
        # When both are added and cognified
        assert run("add", str(env / "refused.txt"), str(env / "fine.txt")).exit_code == 0
        cognified = run("cognify")
        status = run("status", "--json")
    # Then the refused chunk failed with a short error naming the status, without the secret
    assert cognified.exit_code == 1 and SECRET not in cognified.output
    with Kenning(load_settings()) as memory:
        chunks = memory.wiring.chunks
        records = chunks.get_chunks(chunks.list_chunk_ids(memory.dataset().id))
    failed = [record for record in records if record.status == ChunkStatus.FAILED]
    assert failed and all("HTTP 400" in record.error for record in failed)
    assert all(SECRET not in record.error and len(record.error) <= 3 * MAX_ERROR_CHARS for record in failed)
    # And status shows the endpoint and every error without it
    assert status.exit_code == 0 and SECRET not in status.output
    assert json.loads(status.output)["llm"]["endpoint"].startswith("http://127.0.0.1:")


def test_an_unreachable_llm_leaves_no_credentials_in_status_or_a_completion_error(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an LLM URL with credentials whose port nothing listens on
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("KENNING_LLM_URL", f"http://user:{SECRET}@127.0.0.1:{port}/v1")
    (env / "note.txt").write_text("Grace Hopper wrote the first compiler.")
    assert run("add", str(env / "note.txt")).exit_code == 0
    # When a cognify opens its breaker, and a completion is asked for
    cognified = run("cognify")
    answered = CliRunner().invoke(main, ["search", "Who wrote a compiler?", "--type", "RAG_COMPLETION"])
    status = run("status", "--json")
    # Then none of what they print holds the secret, the breaker's reason included
    assert cognified.exit_code != 0 and answered.exit_code != 0
    for printed in (cognified.output, answered.output, str(answered.exception or ""), status.output):
        assert SECRET not in printed
    llm = json.loads(status.output)["llm"]
    assert llm["breaker"] == "open" and "127.0.0.1" in llm["endpoint"]
