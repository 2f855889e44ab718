"""Progress counts real units (documents, chunks written) and moves while a step runs."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from kenning.pipeline import tasks
from kenning.pipeline.context import Job
from kenning.pipeline.models import ChunkStatus, PipelineRun, RunStatus
from kenning.pipeline.plan import PLAN
from kenning.pipeline.progress import reporting
from kenning.workers.celery.canvas import add_bars, draw
from kenning.workers.memory import Kenning
from kenning.workers.runtime.local_runner import LocalRunner
from kenning.workers.runtime.settings import load_settings

TEXTS = [
    f"Document {n}. Ada Lovelace wrote notes on the Analytical Engine. "
    f"Charles Babbage designed it in London. Grace Hopper built a compiler in {1950 + n}."
    for n in range(5)
]


def test_an_embedded_run_reports_documents_as_it_goes(tmp_path: Path) -> None:
    # Given five documents
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash")
    calls: list[tuple[str, int, int]] = []
    with Kenning(settings) as memory:
        for n, text in enumerate(TEXTS):
            memory.add_text(text, "d", name=f"doc{n}.txt")

        # When the dataset is cognified with a progress callback that records its calls
        run = memory.cognify("d", progress=lambda step, done, total: calls.append((step, done, total)))

    # Then classify and chunk count the documents, one by one, not one step as 1/1
    assert run.status == RunStatus.COMPLETED
    assert [c for c in calls if c[0] == "classify"] == [("classify", n, 5) for n in range(6)]
    assert [c for c in calls if c[0] == "chunk"] == [("chunk", n, 5) for n in range(6)]
    # And the load step's bar starts when the step does and ends full
    load = [(done, total) for step, done, total in calls if step == "load"]
    assert load[0][0] == 0 and load[-1][0] == load[-1][1]


def test_load_reports_the_chunks_written_batch_by_batch(tmp_path: Path) -> None:
    # Given five documents extracted, and loaded two chunks a batch
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", load_batch=2)
    calls: list[tuple[str, int, int]] = []
    with Kenning(settings) as memory:
        for n, text in enumerate(TEXTS):
            memory.add_text(text, "d", name=f"doc{n}.txt")
        extract = [step for step in PLAN if step.name != "load" and step.name != "fk_edges"]
        run = LocalRunner(memory.wiring, memory.wiring.lock, plan=extract).run(memory.scope("d"))
        job = Job(run_id=run.id, dataset_id=run.dataset_id, tenant=settings.tenant, dataset="d")

        # When the load step runs with a listener for its progress
        with reporting(lambda step, done, total: calls.append((step, done, total))):
            counts = tasks.load(memory.wiring, job)

    # Then it counts the chunks written, batch by batch, from none to all of them
    chunks = run.stats["chunks_to_extract"]
    assert chunks >= 5 and counts["nodes"] > 0
    assert calls == [("load", done, chunks) for done in sorted({0, *range(2, chunks, 2), chunks})]


def test_the_distributed_view_has_a_bar_of_the_chunks_written() -> None:
    # Given a run's bars, and a run in its load step with 3 of 8 chunks written
    console = Console(file=io.StringIO())
    job = Job(run_id="r" * 32, dataset_id="d", tenant="t", dataset="d")
    run = PipelineRun(id=job.run_id, dataset_id="d", status=RunStatus.STARTED, step="extract")
    counts = {status: 0 for status in ChunkStatus} | {ChunkStatus.EXTRACTED: 5, ChunkStatus.LOADED: 3}
    with Progress(console=console) as bars:
        run_bars = add_bars(bars, job, labelled=False)

        # When it is drawn
        draw(bars, run_bars, run, counts)

        # Then the loaded bar shows the chunks written so far, out of all of them
        loaded = bars.tasks[run_bars.loaded]
        assert (loaded.completed, loaded.total) == (3, 8)
        assert bars.tasks[run_bars.chunks].completed == 8


def test_a_stalled_run_is_drawn_as_stalled_with_why_not_as_live() -> None:
    # Given a started run in its extract step that nothing works on
    console = Console(file=io.StringIO())
    job = Job(run_id="s" * 32, dataset_id="d", tenant="t", dataset="d")
    run = PipelineRun(id=job.run_id, dataset_id="d", status=RunStatus.STARTED, step="chunk")
    counts = dict.fromkeys(ChunkStatus, 0) | {ChunkStatus.PENDING: 4}
    with Progress(console=console) as bars:
        run_bars = add_bars(bars, job, labelled=False)

        # When it is drawn with the reason it is stalled
        draw(bars, run_bars, run, counts, stalled="no worker consumes kenning.extract")

        # Then its step bar says it is stalled, and why, instead of naming the next step
        description = bars.tasks[run_bars.steps].description
        assert description == "stalled: no worker consumes kenning.extract"

        # And once something works on it again it is drawn as live
        draw(bars, run_bars, run, counts)
        assert bars.tasks[run_bars.steps].description == "extract"


def test_a_step_streamed_pass_after_pass_reports_one_count(tmp_path: Path) -> None:
    # Given an embedded run whose load streams behind extraction, pass after pass (at least the
    # last one after extraction ends)
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", load_batch=4)
    calls: list[tuple[str, int, int]] = []
    with Kenning(settings) as memory:
        for n, text in enumerate(TEXTS * 3):
            memory.add_text(f"{text} Copy {n}.", "d", name=f"doc{n}.txt")
        run = memory.cognify("d", progress=lambda step, done, total: calls.append((step, done, total)))
    # Then the load bar counts up, never back, to all the chunks written
    load = [(done, total) for step, done, total in calls if step == "load"]
    chunks = run.stats["chunks_to_extract"]
    assert load and load[-1] == (chunks, chunks), load
    assert [done for done, _ in load] == sorted(done for done, _ in load), load
    assert all(total <= chunks for _, total in load), load
