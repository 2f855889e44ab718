"""What a command draws while memory is made: one bar per pipeline step and one for the run's LLM
requests, and the line a run ends with."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import PipelineRun
from kenning.pipeline.spend import SpendLedger, current_charge
from kenning.workers.cli.show import safe
from kenning.workers.memory import Kenning

console = Console(stderr=True)


def cognify_drawn(memory: Kenning, dataset: str | None) -> PipelineRun:
    """Cognify the dataset as `kenning cognify` does, drawing its progress: this process's bars
    (embedded), or the workers' progress as the run is followed (distributed)."""
    if memory.wiring.distributed:
        return memory.cognify(dataset, console=console)
    with progress_bars(memory.wiring.spend) as advance:
        return memory.cognify(dataset, progress=advance)


@contextmanager
def progress_bars(
    ledger: SpendLedger | None = None, output: Console | None = None
) -> Iterator[Callable[[str, int, int], None]]:
    """A progress callback drawing one bar per pipeline step; with a `ledger`, one more for the
    run's LLM requests (`LLMBar`), its failed ones (retried unless their call gave up) named."""
    columns = (TextColumn("{task.description:>9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=output or console, transient=False) as bars:
        tasks: dict[str, Any] = {}
        llm = LLMBar(bars, ledger)

        def advance(step: str, done: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = bars.add_task(step, total=max(total, 1))
            bars.update(tasks[step], completed=done if total else 1, total=max(total, 1))
            llm.update()

        yield advance
        llm.finish()


class LLMBar:
    """The LLM requests of the run a step reports for (its charge), from the spend ledger: those
    not failed of those sent, and how many failed. Read at most every `every_s`; a ledger that
    is away is skipped."""

    def __init__(self, bars: Progress, ledger: SpendLedger | None, every_s: float = 0.5) -> None:
        self._bars, self._ledger, self._every_s = bars, ledger, every_s
        self._task: TaskID | None = None
        self._run_id = ""
        self._next = 0.0
        self._lock = threading.Lock()

    def update(self) -> None:
        charge = current_charge()
        with self._lock:
            if charge is None or time.monotonic() < self._next:
                return
            self._next = time.monotonic() + self._every_s
            self._run_id = charge.run_id
            self._draw()

    def finish(self) -> None:
        """Draw the run's last figures, however recently it was read."""
        with self._lock:
            self._draw()

    def _draw(self) -> None:
        if self._ledger is None or not self._run_id:
            return
        try:
            spent = self._ledger.totals([self._run_id]).get(self._run_id)
        except StoreError:
            return
        if spent is None:
            return
        if self._task is None:
            self._task = self._bars.add_task("LLM", total=None)
        self._bars.update(
            self._task, description=safe(spent.label), completed=spent.answered, total=spent.calls
        )


def print_run(run: PipelineRun) -> None:
    figures = ", ".join(f"{name} {value}" for name, value in sorted(run.stats.items()))
    console.print(f"run {run.id[:8]} {run.status.value}: {safe(figures)}")
    if run.error:
        console.print(f"[red]{safe(run.error)}[/red]")
