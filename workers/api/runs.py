"""Cognify runs started over HTTP: in a background thread embedded, or on the Celery workers.

A run's id is known before it starts, so `POST /v1/cognify` answers at once with it; the run
may still wait for the dataset's lock (status `initiated`). Its record in the metadata store
is the truth about it; the tracker adds what only this process knows: the live step
progress, and an error raised before the run could be recorded.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field

from kenning.pipeline.errors import NotFound
from kenning.pipeline.models import ENDED, RUNNING, Dataset, PipelineRun, Scope
from kenning.pipeline.permission import Caller, Permission
from kenning.pipeline.ports import MetadataStore
from kenning.workers.api.schemas import RunList, RunView
from kenning.workers.control.runs import StallDetector
from kenning.workers.memory import Kenning
from kenning.workers.runtime.extras import needs_extra

log = logging.getLogger("kenning.api")
FINISHED = frozenset(status.value for status in ENDED)
KEEP_FINISHED = 1000
POLL_S = 0.5


@dataclass
class Tracked:
    run_id: str
    tenant: str
    dataset: str
    progress: dict[str, list[int]] = field(default_factory=dict)
    error: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    def advance(self, step: str, done: int, total: int) -> None:
        self.progress[step] = [done, total]


class RunTracker:
    """The runs this process started, with their live progress; `close` waits for those in flight."""

    def __init__(self) -> None:
        self._runs: dict[str, Tracked] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._detector: StallDetector | None = None

    def start(self, memory: Kenning, dataset: str, *, wait: bool = False) -> str:
        """Start a cognify run of the caller's dataset, on the runner of the memory's mode; its id.
        With `wait`, return when it ended."""
        if memory.wiring.distributed:
            run_id = self._enqueue(memory, dataset)
            if wait:
                self._follow(memory.wiring.metadata, run_id, memory.settings.cognify_timeout_s)
            return run_id
        tracked = self._track(Tracked(run_id=uuid.uuid4().hex, tenant=memory.caller.tenant, dataset=dataset))
        if wait:
            self._cognify(memory, tracked)
            return tracked.run_id
        thread = threading.Thread(
            target=self._cognify, args=(memory, tracked), name=f"kenning-cognify-{tracked.run_id[:8]}"
        )
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return tracked.run_id

    def _track(self, tracked: Tracked) -> Tracked:
        with self._lock:
            finished = [key for key, run in self._runs.items() if run.done.is_set()]
            for key in finished[: max(0, len(finished) - KEEP_FINISHED)]:
                del self._runs[key]
            self._runs[tracked.run_id] = tracked
        return tracked

    def _cognify(self, memory: Kenning, tracked: Tracked) -> None:
        try:
            memory.cognify(tracked.dataset, progress=tracked.advance, run_id=tracked.run_id)
        except Exception as error:  # the run's record says errored; one that never started, the tracker
            tracked.error = f"{type(error).__name__}: {error}"
            log.warning("cognify run %s of %s failed: %s", tracked.run_id, tracked.dataset, tracked.error)
        finally:
            tracked.done.set()

    def _enqueue(self, memory: Kenning, dataset: str) -> str:
        with needs_extra("kenning serve --distributed"):
            from kenning.workers.celery.canvas import enqueue

        job = enqueue(memory.wiring, memory.settings, Scope(tenant=memory.caller.tenant, dataset=dataset))
        return job.run_id

    def _follow(self, metadata: MetadataStore, run_id: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = metadata.get_run(run_id)
            if run is not None and run.status.value in FINISHED:
                return
            time.sleep(POLL_S)

    def view(self, caller: Caller, memory: Kenning, run_id: str) -> RunView:
        """The run as the caller may see it: one of a dataset it may read or write; else NotFound."""
        metadata = memory.wiring.metadata
        tracked = self._runs.get(run_id)
        run = metadata.get_run(run_id)
        if run is not None:
            dataset = _dataset_of(caller, metadata, run)
            stalled = self._stalled(memory, [(dataset, run)]).get(run.id, "")
            return RunView.of(run, dataset.name, dict(tracked.progress) if tracked else None, stalled)
        if tracked is None or tracked.tenant != caller.tenant or not _sees(caller, tracked.dataset):
            raise NotFound(f"no run {run_id!r}")
        status = "errored" if tracked.error else "initiated"
        return RunView(id=run_id, dataset=tracked.dataset, status=status, error=tracked.error)

    def recent(self, caller: Caller, memory: Kenning, dataset: str | None, limit: int) -> RunList:
        """The most recent runs of the datasets the caller may read or write (or of the one named)."""
        metadata = memory.wiring.metadata
        datasets = [d for d in metadata.list_datasets(caller.tenant) if _sees(caller, d.name)]
        if dataset is not None:
            datasets = [d for d in datasets if d.name == dataset]
            if not datasets:
                raise NotFound(f"no dataset {dataset!r}")
        runs = [(d, run) for d in datasets for run in metadata.list_runs(d.id)]
        runs = sorted(runs, key=lambda pair: (pair[1].started_at, pair[1].id), reverse=True)[:limit]
        stalled = self._stalled(memory, runs)
        views = [RunView.of(run, d.name, self._progress(run.id), stalled.get(run.id, "")) for d, run in runs]
        return RunList(runs=views)

    def _progress(self, run_id: str) -> dict[str, list[int]] | None:
        tracked = self._runs.get(run_id)
        return dict(tracked.progress) if tracked else None

    def _stalled(self, memory: Kenning, runs: list[tuple[Dataset, PipelineRun]]) -> dict[str, str]:
        """Why each of the runs not ended makes no progress; the detector is kept, so that event
        streams polling a run ask the workers at most every `run_control.CHECK_REUSE_S`."""
        if not any(run.status in RUNNING for _, run in runs):
            return {}
        with self._lock:
            if self._detector is None:
                self._detector = StallDetector(memory.settings)
            detector = self._detector
        return detector.reasons(runs)

    def close(self) -> None:
        with self._lock:
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()


def _sees(caller: Caller, dataset: str) -> bool:
    return caller.may(Permission.READ, dataset) or caller.may(Permission.WRITE, dataset)


def _dataset_of(caller: Caller, metadata: MetadataStore, run: PipelineRun) -> Dataset:
    for dataset in metadata.list_datasets(caller.tenant):
        if dataset.id == run.dataset_id and _sees(caller, dataset.name):
            return dataset
    raise NotFound(f"no run {run.id!r}")
