"""A run that did not do all its work says so: status, exit code, and each failure with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kenning.pipeline.models import Extraction, RunStatus
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring
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


class DiesAfter:
    """The offline extractor, until its process "dies" (an exception no step handles) at call n."""

    # The extractor it stands for: what it extracted is cached for the run that resumes.
    model = CountingExtractor.model
    prompt_version = CountingExtractor.prompt_version

    def __init__(self, calls: int) -> None:
        self.left = calls
        self._inner = CountingExtractor()

    def extract(self, text: str) -> Extraction:
        self.left -= 1
        if self.left < 0:
            raise SystemExit("killed")
        return self._inner.extract(text)


def test_a_run_whose_process_died_is_marked_interrupted_by_the_next_and_kept_its_spend(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        home=tmp_path / "home", embedding_provider="hash", concurrency=1, extract_batch=2
    )
    # Given a run that dies in the middle of extraction, its process gone before it could say so
    dying = Kenning(settings, Wiring(settings, {"extractor": DiesAfter(4)}))
    for n in range(8):
        dying.add_text(f"Note {n}: Ada Lovelace met Charles Babbage in London.", "d", name=f"n{n}")
    with pytest.raises(SystemExit):
        dying.cognify("d")
    dataset = dying.wiring.metadata.get_dataset(dying.scope("d"))
    assert dataset is not None
    [dead] = dying.wiring.metadata.list_runs(dataset.id)
    dead.status = RunStatus.STARTED  # as a kill -9 leaves it: no chance to record the failure
    dying.wiring.metadata.save_run(dead)
    # Its finished batches' extractions are counted already
    assert dead.stats["extractions"] == 4

    # When the next cognify runs
    with Kenning(settings, Wiring(settings, {"extractor": CountingExtractor()})) as memory:
        run = memory.cognify("d")
        runs = {r.id: r for r in memory.wiring.metadata.list_runs(dataset.id)}
    dying.close()

    # Then it resumed the work (only the rest was extracted) and marked the dead run interrupted
    assert run.status.value == "completed" and run.stats["extractions"] == 4
    assert runs[dead.id].status == RunStatus.INTERRUPTED and run.id in runs[dead.id].error


def test_status_marks_a_run_whose_process_is_gone_interrupted(tmp_path: Path) -> None:
    import os
    import subprocess

    from kenning.pipeline.models import EMBEDDED
    from kenning.pipeline.plan import record_step, start_run
    from kenning.workers.runtime.local_runner import EMBEDDED_PID

    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    with Kenning(settings) as memory:
        memory.add_text("Ada Lovelace wrote the first program.", "d")
        # Given a started run whose process was killed, and one whose process is alive (this one)
        dead_pid = subprocess.Popen(["true"])
        dead_pid.wait()
        dead = start_run(memory.wiring, memory.scope("d"), mode=EMBEDDED)
        record_step(memory.wiring, dead, "extract", {EMBEDDED_PID: dead_pid.pid})
        live = start_run(memory.wiring, memory.scope("d"), mode=EMBEDDED)
        record_step(memory.wiring, live, "extract", {EMBEDDED_PID: os.getpid()})

        # When status is read
        [status] = memory.status("d")

        # Then the dead run is interrupted, and the live one is not
        runs = {run["id"]: run for run in status["runs"]}
        assert runs[dead.run_id]["status"] == "interrupted" and "ended before" in runs[dead.run_id]["error"]
        assert runs[live.run_id]["status"] == "started"
        assert [job.run_id for job in memory.started_jobs("d")] == [live.run_id]


def test_a_cancelled_run_is_finished_once_its_process_is_gone(tmp_path: Path) -> None:
    import subprocess

    from kenning.pipeline.models import EMBEDDED
    from kenning.pipeline.plan import record_step, start_run
    from kenning.workers.control.runs import cancel_run
    from kenning.workers.runtime.local_runner import EMBEDDED_PID

    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    with Kenning(settings) as memory, subprocess.Popen(["sleep", "60"]) as process:
        memory.add_text("Ada Lovelace wrote the first program.", "d")
        # Given a started run whose process is alive, cancelled: it is not finished yet
        job = start_run(memory.wiring, memory.scope("d"), mode=EMBEDDED)
        record_step(memory.wiring, job, "extract", {EMBEDDED_PID: process.pid})
        assert cancel_run(memory, job.run_id, "wrong corpus").finished_at is None
        # When its process dies before it finished the run
        process.kill()
        process.wait()
        # Then status shows it cancelled and finished
        [status] = memory.status("d")
        [run] = [run for run in status["runs"] if run["id"] == job.run_id]
        assert run["status"] == "cancelled" and run["finished_at"] is not None
