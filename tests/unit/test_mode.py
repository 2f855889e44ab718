"""One mode: chosen once in the settings, forced by the distributed flags in the wiring, read by
the run lock, the runner, the stall detector and cancel alike; and a run says its mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from kenning.pipeline.errors import ConfigError
from kenning.pipeline.models import DISTRIBUTED, EMBEDDED, Dataset, PipelineRun, RunStatus, Scope, utcnow
from kenning.pipeline.plan import start_run
from kenning.storage.coordination.kept_lock import KeptRunLock
from kenning.storage.coordination.lock import FileLock, MemoryLock
from kenning.storage.metadata.memory import MemoryMetadataStore
from kenning.workers.control.runs import StallDetector
from kenning.workers.memory import Kenning
from kenning.workers.runtime.local_runner import LocalRunner
from kenning.workers.runtime.settings import Settings, in_mode, load_settings
from kenning.workers.runtime.wiring import Wiring

QDRANT = "http://127.0.0.1:6333"
POSTGRES = "postgresql+psycopg://kenning@127.0.0.1/kenning"


@pytest.mark.parametrize(
    ("stores", "mode"),
    [
        ({}, "embedded"),
        ({"qdrant_url": QDRANT}, "embedded"),
        ({"metadata_url": POSTGRES}, "embedded"),
        ({"qdrant_url": QDRANT, "metadata_url": "sqlite:////tmp/kenning.db"}, "embedded"),
        ({"qdrant_url": QDRANT, "metadata_url": POSTGRES}, "distributed"),
    ],
)
def test_the_mode_not_given_is_distributed_only_when_nothing_lives_on_the_local_disk(
    stores: dict[str, str], mode: str
) -> None:
    assert load_settings(**stores).mode == mode


def test_the_mode_given_wins_over_the_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_MODE", "embedded")
    assert load_settings(qdrant_url=QDRANT, metadata_url=POSTGRES).mode == "embedded"
    monkeypatch.setenv("KENNING_MODE", "distributed")
    assert load_settings().mode == "distributed"
    monkeypatch.setenv("KENNING_MODE", "")
    assert load_settings(qdrant_url=QDRANT, metadata_url=POSTGRES).mode == "distributed"


def test_a_bad_mode_names_the_variable_and_what_it_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_MODE", "cluster")
    with pytest.raises(ConfigError) as raised:
        load_settings()
    assert "KENNING_MODE" in str(raised.value) and "embedded or distributed" in str(raised.value)


def test_the_distributed_flag_forces_the_one_mode_every_surface_reads(tmp_path: Path) -> None:
    # Given embedded settings, when a surface asks for distributed (serve --distributed, a worker)
    settings = load_settings(home=tmp_path, embedding_provider="hash")
    wiring = Wiring(settings, distributed=True)
    # Then the wiring, the memory over it and the settings it holds all say distributed
    assert settings.mode == "embedded" and in_mode(settings, "distributed").mode == "distributed"
    assert wiring.distributed and wiring.settings.mode == "distributed"
    memory = Kenning(settings, wiring)
    assert memory.settings.mode == "distributed"
    # And the dataset lock is the Redis run lock (opened lazily: no Redis is asked here)
    assert isinstance(wiring.lock, KeptRunLock)
    wiring.close()


def test_the_embedded_lock_is_the_file_lock(tmp_path: Path) -> None:
    wiring = Wiring(load_settings(home=tmp_path, embedding_provider="hash"))
    assert not wiring.distributed and isinstance(wiring.lock, FileLock)


def test_a_run_records_its_mode_from_its_first_write(tmp_path: Path) -> None:
    # Given services over the in-memory metadata store
    wiring = Wiring(
        load_settings(home=tmp_path, embedding_provider="hash"), {"metadata": MemoryMetadataStore()}
    )
    scope = Scope(tenant="default", dataset="docs")
    # When runs start in each mode (the default is the Celery workers')
    embedded = start_run(wiring, scope, mode=EMBEDDED)
    distributed = start_run(wiring, scope)
    # Then each record says its mode before any step wrote a counter
    assert [wiring.metadata.get_run(job.run_id).mode for job in (embedded, distributed)] == [  # type: ignore[union-attr]
        EMBEDDED,
        DISTRIBUTED,
    ]


def test_a_cancelled_run_stays_cancelled_when_its_runner_saves_it_as_running() -> None:
    # Given a run its runner has read, and then an operator cancelled
    store = MemoryMetadataStore()
    dataset = store.ensure_dataset(Scope(tenant="default", dataset="docs"))
    read = PipelineRun(id="r1", dataset_id=dataset.id, status=RunStatus.STARTED, mode=EMBEDDED)
    store.save_run(read)
    cancelled = read.model_copy(
        update={"status": RunStatus.CANCELLED, "error": "cancelled", "finished_at": utcnow()}
    )
    store.save_run(cancelled)
    # When the runner writes what it read, with a step's counters added
    store.save_run(read.model_copy(update={"stats": {"extracted": 2}, "step": "extract"}))
    # Then the counters are kept and the run is still cancelled
    run = store.get_run("r1")
    assert run is not None and run.status == RunStatus.CANCELLED and run.error == "cancelled"
    assert run.stats == {"extracted": 2} and run.finished_at is not None


class Workers:
    """Stands for the look at the Celery workers over the broker; counts the looks."""

    def __init__(self, reason: str = "") -> None:
        self.asked = 0
        self.reason = reason

    def __call__(self, _settings: Settings) -> str:
        self.asked += 1
        return self.reason


def test_an_embedded_run_before_its_pid_is_written_is_not_stalled_and_asks_no_broker() -> None:
    # Given an embedded run just started: its mode is written, its process id not yet
    dataset = Dataset.of(Scope(tenant="default", dataset="docs"))
    run = PipelineRun(id="r1", dataset_id=dataset.id, status=RunStatus.STARTED, mode=EMBEDDED)
    workers = Workers("no worker consumes kenning.pipeline")
    detector = StallDetector(load_settings(broker_url="redis://127.0.0.1:9/0"), ask_workers=workers)
    # When the stall detector looks at it
    reasons = detector.reasons([(dataset, run)])
    # Then it is not stalled, and the broker was never asked
    assert reasons == {} and workers.asked == 0


def test_a_distributed_run_is_asked_about() -> None:
    # Given a Celery run and no worker answering
    dataset = Dataset.of(Scope(tenant="default", dataset="docs"))
    run = PipelineRun(id="r1", dataset_id=dataset.id, status=RunStatus.STARTED, mode=DISTRIBUTED)
    workers = Workers("no worker consumes kenning.pipeline")
    # Then the detector asks the workers, and says why it is stalled
    reasons = StallDetector(load_settings(), ask_workers=workers).reasons([(dataset, run)])
    assert reasons == {"r1": "no worker consumes kenning.pipeline"} and workers.asked == 1


def test_a_run_recorded_before_runs_had_a_mode_is_told_by_its_pid() -> None:
    assert PipelineRun(id="r", dataset_id="d", stats={"embedded_pid": 42}).embedded
    assert not PipelineRun(id="r", dataset_id="d").embedded


def test_the_kept_lock_excludes_and_frees_like_the_run_lock_under_it() -> None:
    # Given the run lock a Celery run holds, and the kept lock of another surface over it
    runs = MemoryLock()
    kept = KeptRunLock(runs)
    assert runs.take("dataset:t:d", "celery-run", 60) is not None
    # Then the other surface cannot take it until the run lets go
    assert kept.acquire("dataset:t:d", 60) is None
    runs.release_run("dataset:t:d", "celery-run")
    token = kept.acquire("dataset:t:d", 60)
    assert token is not None and runs.take("dataset:t:d", "celery-run", 60) is None
    kept.release("dataset:t:d", token)
    assert runs.holder("dataset:t:d") is None


def test_an_embedded_run_interrupts_stale_embedded_runs_and_leaves_distributed_ones_to_the_supervisor(
    tmp_path: Path,
) -> None:
    # Given a Celery run of the dataset waiting for its lock, and an embedded run whose process died
    settings = load_settings(home=tmp_path, embedding_provider="hash")
    wiring = Wiring(settings, {"metadata": MemoryMetadataStore()})
    scope = Scope(tenant="default", dataset="docs")
    waiting = start_run(wiring, scope, mode=DISTRIBUTED)
    stale = start_run(wiring, scope, mode=EMBEDDED)
    # When an embedded run of the dataset runs (under the lock)
    run = LocalRunner(wiring, MemoryLock(), plan=()).run(scope)
    # Then it interrupted the stale embedded run only
    assert run.status == RunStatus.COMPLETED
    assert wiring.metadata.get_run(stale.run_id).status == RunStatus.INTERRUPTED  # type: ignore[union-attr]
    assert wiring.metadata.get_run(waiting.run_id).status == RunStatus.STARTED  # type: ignore[union-attr]
