"""The progress of a run shows its LLM requests, and how many failed (each retried unless its
call gave up): embedded (`progress_bars`) and distributed (`canvas.draw`)."""

from __future__ import annotations

import pytest
from rich.console import Console
from rich.progress import Progress

from kenning.pipeline.context import Job
from kenning.pipeline.models import ChunkStatus, PipelineRun, RunStatus
from kenning.pipeline.spend import Charge, Spend, charged_to
from kenning.storage.metadata.spend import MemorySpendLedger
from kenning.workers.cli.progress import progress_bars

canvas = pytest.importorskip("kenning.workers.celery.canvas")


def ledger_with_failures() -> MemorySpendLedger:
    """Run r1: four requests, two answered, one timed out, one in flight."""
    ledger = MemorySpendLedger()
    charge = Charge(run_id="r1", dataset_id="d1")
    for attempt in ("a1", "a2", "a3", "a4"):
        ledger.sent(attempt, charge, "m", 100, 20)
    ledger.answered("a1", 100, 20)
    ledger.answered("a2", 100, 20)
    ledger.answered("a3", 0, 0)
    return ledger


def test_the_embedded_progress_shows_the_runs_failed_llm_requests() -> None:
    ledger = ledger_with_failures()
    output = Console(record=True, width=100, force_terminal=False)
    with progress_bars(ledger, output) as advance, charged_to("r1", "d1"):
        advance("extract", 1, 2)
        # A request that fails just before the run ends is drawn too
        ledger.answered("a4", 0, 0)
        advance("extract", 2, 2)
    text = output.export_text()
    assert "LLM requests, 2 failed" in text and "2/4" in text, text


def test_the_distributed_progress_shows_the_runs_failed_llm_requests() -> None:
    output = Console(record=True, width=120, force_terminal=False)
    job = Job(run_id="r1", dataset_id="d1", tenant="t", dataset="notes")
    run = PipelineRun(id="r1", dataset_id="d1", status=RunStatus.STARTED, step="chunk")
    counts = dict.fromkeys(ChunkStatus, 0) | {ChunkStatus.PENDING: 3, ChunkStatus.FAILED: 1}
    with Progress(console=output, transient=False) as bars:
        run_bars = canvas.add_bars(bars, job, labelled=False)
        canvas.draw(bars, run_bars, run, counts, spent=Spend(calls=9, failed=4))
    assert "LLM requests, 4 failed" in output.export_text(), output.export_text()
