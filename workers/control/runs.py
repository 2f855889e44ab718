"""What an operator does with runs: list them (a stalled one says why), cancel one, retry one.

The CLI (`kenning runs ...`), the Celery tasks (`kenning.runs_list`, `kenning.runs_cancel`,
`kenning.runs_retry`) and the HTTP API (`/v1/runs`) all call these functions.

A run that has not ended is *stalled* when nothing can be working on it, and `stall_reasons`
says why: no worker consumes the queues its tasks go to, the Redis that holds its lock and
leases does not answer, its dataset lock is free (every task that held it is gone), or its
leases expired. A stalled run is never shown as live; the supervisor, or an operator's
`cancel` then `retry`, ends it and resumes its work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from kenning.pipeline.errors import InputError, NotFound, StoreError
from kenning.pipeline.ladder import AUTO
from kenning.pipeline.lease import LeaseState, stall_reason
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import ENDED, RUNNING, Dataset, PipelineRun, RunStatus, utcnow
from kenning.pipeline.permission import Permission
from kenning.pipeline.redact import redact_url
from kenning.pipeline.spend import breaker_key
from kenning.workers.memory import Kenning
from kenning.workers.runtime.local_runner import close_dead_runs, in_its_process
from kenning.workers.runtime.settings import Settings

# The queues every task of a distributed run goes to.
RUN_QUEUES = ("pipeline", "extract", "load")
# How long one look at the workers and Redis is reused: status pages poll every half second.
CHECK_REUSE_S = 10.0
CANCELLED_BY = "cancelled by the operator"


class RunSummary(BaseModel):
    """A run as `kenning runs list` shows it; `stalled` says why a run not ended makes no progress."""

    id: str
    dataset: str
    status: str
    step: str = ""
    error: str = ""
    stalled: str = Field(default="", description="Why the run, not ended, makes no progress; empty if it may")
    stats: dict[str, int] = Field(default_factory=dict)
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @classmethod
    def of(cls, run: PipelineRun, dataset: str, stalled: str = "") -> RunSummary:
        return cls(
            id=run.id,
            dataset=dataset,
            status=run.status.value,
            step=run.step,
            error=run.error,
            stalled=stalled,
            stats=run.stats,
            started_at=run.started_at,
            finished_at=run.finished_at,
        )


class StallDetector:
    """Asks, for the runs not ended, whether anything can still be working on them.

    The look at the workers (`ask_workers`: why none can take a run's tasks, or "") is shared by
    every run checked within `reuse_s`.
    """

    def __init__(
        self,
        settings: Settings,
        reuse_s: float = CHECK_REUSE_S,
        ask_workers: Callable[[Settings], str] | None = None,
    ) -> None:
        self._settings = settings
        self._reuse_s = reuse_s
        self._ask_workers = ask_workers or workers_reason
        self._seen: tuple[float, str] | None = None

    def reasons(self, runs: Sequence[tuple[Dataset, PipelineRun]]) -> dict[str, str]:
        """Run id -> why it is stalled, for each distributed run not ended that is. An embedded run
        (its `mode`, written when it starts) is never asked about: its process runs it while it
        lives, and once gone `close_dead_runs` ends it."""
        distributed = [(d, r) for d, r in runs if r.status in RUNNING and not r.embedded]
        if not distributed:
            return {}
        cluster = self._cluster_reason()
        if cluster:
            return {run.id: cluster for _, run in distributed}
        try:
            with _coordination(self._settings) as coordination:
                found = {run.id: coordination.reason(dataset, run) for dataset, run in distributed}
        except StoreError as error:
            return {run.id: f"store unreachable: {error}" for _, run in distributed}
        return {run_id: why for run_id, why in found.items() if why}

    def _cluster_reason(self) -> str:
        """Why no distributed run can progress now (no workers, the broker away), or ""."""
        now = time.monotonic()
        if self._seen is None or now - self._seen[0] >= self._reuse_s:
            self._seen = (now, self._ask_workers(self._settings))
        return self._seen[1]


def workers_reason(settings: Settings) -> str:
    """Why no worker can take a run's tasks: none consumes one of its queues, or the broker does
    not answer; "" when every queue has a consumer."""
    from kenning.workers.celery.canvas import ask_workers, ping_app

    try:
        ask_workers(ping_app(settings.broker_url), settings, RUN_QUEUES)
    except StoreError as error:  # NoWorker, or the broker away (TransientStoreError)
        return str(error)
    return ""


class _Coordination:
    """The dataset locks and run leases in Redis, as one look at them sees them."""

    def __init__(self, settings: Settings, client: Any) -> None:
        from kenning.storage.coordination.lease_redis import RedisLeases
        from kenning.workers.celery.app import open_lock
        from kenning.workers.runtime.keys import lease_prefix

        self._settings = settings
        self._lock = open_lock(client, settings)
        self._leases = RedisLeases(client, lease_prefix(settings.queue_prefix))
        self.broker = broker_client(settings, client)

    def reason(self, dataset: Dataset, run: PipelineRun) -> str:
        """Why nobody works on the run by its leases, or by its dataset lock; "" when it may progress,
        as it does while some of its tasks wait in the broker."""
        why = lease_reason(self._leases.state(run.id)) or self._lock_reason(dataset, run)
        return "" if why and self._waiting(run.id) else why

    def _waiting(self, run_id: str) -> int:
        from kenning.workers.celery.app import waiting

        return waiting(self._settings, self.broker, run_id)

    def _lock_reason(self, dataset: Dataset, run: PipelineRun) -> str:
        if run.status != RunStatus.STARTED or not run.step:
            return ""  # not begun: it waits for the lock, which another run may hold
        if self._lock.holder(lock_name(dataset.scope)) is not None:
            return ""
        return (
            f"its dataset lock is free: no task of the run has held it for {self._settings.lock_ttl_s:.0f} s "
            "(its workers or messages are lost)"
        )


def broker_client(settings: Settings, client: Any) -> Any:
    """A client of the broker's Redis: `client` when it is the same server, None when the broker
    is not Redis."""
    from kenning.storage.coordination.redis_client import QUICK_TIMEOUT_S, open_redis

    if not settings.broker_url.startswith("redis"):
        return None
    if settings.broker_url == settings.redis_url:
        return client
    return open_redis(settings.broker_url, timeout_s=QUICK_TIMEOUT_S)  # status pages poll


@contextmanager
def _coordination(settings: Settings) -> Iterator[_Coordination]:
    import redis

    from kenning.storage.coordination.redis_client import QUICK_TIMEOUT_S, open_redis

    client = open_redis(settings.redis_url, timeout_s=QUICK_TIMEOUT_S)  # status pages poll
    coordination = None
    try:
        coordination = _Coordination(settings, client)
        yield coordination
    except redis.RedisError as error:
        raise StoreError(redact_url(f"redis at {settings.redis_url}: {error}")) from error
    finally:
        if coordination is not None and coordination.broker not in (None, client):
            coordination.broker.close()
        client.close()


def lease_reason(state: LeaseState) -> str:
    """Why the run's leases say nobody works on it: all expired (`kenning.pipeline.lease.stall_reason`);
    "" while one is live, or while none is known yet (the supervisor gives those a grace lease)."""
    return stall_reason(state) if state.dead else ""


def list_runs(
    memory: Kenning, dataset: str | None = None, limit: int = 20, detector: StallDetector | None = None
) -> list[RunSummary]:
    """The most recent runs, newest first, of the dataset or of every dataset of the tenant."""
    metadata = memory.wiring.metadata
    datasets = [memory.dataset(dataset)] if dataset else metadata.list_datasets(memory.caller.tenant)
    runs: list[tuple[Dataset, PipelineRun]] = []
    for each in datasets:
        close_dead_runs(metadata, each.id)
        runs.extend((each, run) for run in metadata.list_runs(each.id))
    runs.sort(key=lambda pair: (pair[1].started_at, pair[1].id), reverse=True)
    runs = runs[:limit]
    stalled = (detector or StallDetector(memory.settings)).reasons(runs)
    return [RunSummary.of(run, d.name, stalled.get(run.id, "")) for d, run in runs]


def find_run(memory: Kenning, run_id: str) -> tuple[Dataset, PipelineRun]:
    """The run of that id (or of that unique id prefix) in a dataset of the tenant the caller may
    read or write; else NotFound, the same for a run missing and one the caller may not see."""
    metadata, caller = memory.wiring.metadata, memory.caller
    found: list[tuple[Dataset, PipelineRun]] = []
    for dataset in metadata.list_datasets(caller.tenant):
        if not (caller.may(Permission.READ, dataset.name) or caller.may(Permission.WRITE, dataset.name)):
            continue
        found.extend((dataset, run) for run in metadata.list_runs(dataset.id) if run.id.startswith(run_id))
    exact = [pair for pair in found if pair[1].id == run_id]
    if exact or len(found) == 1:
        return (exact or found)[0]
    if found:
        raise InputError(f"{len(found)} runs start with {run_id!r}: give more of the id")
    raise NotFound(f"no run {run_id!r}")


def cancel_run(memory: Kenning, run_id: str, reason: str = "") -> RunSummary:
    """End a run not ended: marked `cancelled` with the reason.

    A distributed run's dataset lock is released: its tasks still in flight stop at their next
    write, which the lock fences, and a message of it delivered later stops before it starts
    (the run has ended). An embedded run's process reads the mark between batches: it sends
    no more, records those in flight, and lets go of the lock itself; until then the run has no
    `finished_at` (its process sets it). What a run finished stays done: `retry_run` (or any
    cognify of the dataset) does the rest.
    """
    dataset, run = find_run(memory, run_id)
    if run.status in ENDED:
        raise InputError(f"run {run.id} has already ended ({run.status.value}): nothing to cancel")
    run.status, run.finished_at = RunStatus.CANCELLED, None if in_its_process(run) else utcnow()
    run.error = f"{CANCELLED_BY}{': ' + reason if reason else ''} (at step {run.step or 'begin'})"
    # Saved before the lock is released: a task that finds the lock free reads the run, sees it
    # ended, and stops instead of taking the lock again.
    memory.wiring.metadata.save_run(run)
    if not run.embedded:
        release_run_lock(memory.settings, dataset, run.id)
    return RunSummary.of(run, dataset.name)


def release_run_lock(settings: Settings, dataset: Dataset, run_id: str) -> None:
    """Let go of the dataset lock if the run holds it (also a moment later: a heartbeat that read
    the run just before it ended may have taken it again)."""
    import redis

    from kenning.storage.coordination.redis_client import open_redis
    from kenning.workers.celery.app import open_lock

    client = open_redis(settings.redis_url)
    try:
        lock = open_lock(client, settings)
        for pause in (0.0, 0.5):
            time.sleep(pause)
            lock.release_run(lock_name(dataset.scope), run_id)
    except redis.RedisError as error:
        raise StoreError(f"run cancelled, but its dataset lock could not be released: {error}") from error
    finally:
        client.close()


def retry_target(memory: Kenning, run_id: str) -> Dataset:
    """The dataset of a run that has ended, to start its retry in; an error for one still going."""
    dataset, run = find_run(memory, run_id)
    if run.status in RUNNING:
        raise InputError(
            f"run {run.id} has not ended ({run.status.value}); cancel it first (`kenning runs cancel`)"
        )
    return dataset


def retry_run(memory: Kenning, run_id: str, start: Callable[[Dataset], str]) -> str:
    """Start a new run of the ended run's dataset with `start`; its id. The new run redoes only what
    is not done: items not yet chunked, chunks not extracted (or failed), chunks not loaded."""
    return start(retry_target(memory, run_id))


def mark_stalled(
    memory: Kenning, status: list[dict[str, Any]], detector: StallDetector | None = None
) -> None:
    """Add `stalled` to every run of a `Kenning.status` answer: why it makes no progress, or ""."""
    pairs: list[tuple[Dataset, PipelineRun]] = []
    for entry in status:
        dataset = memory.dataset(entry["dataset"])
        pairs.extend((dataset, PipelineRun.model_validate(run)) for run in entry["runs"])
    stalled = (detector or StallDetector(memory.settings)).reasons(pairs)
    for entry in status:
        for run in entry["runs"]:
            run["stalled"] = stalled.get(run["id"], "")


def structured_output(memory: Kenning) -> str:
    """How extraction asks the LLM for structured output: the rung forced by KENNING_LLM_STRUCTURED,
    else the one the endpoint's model was found to take, else "not yet known"."""
    settings = memory.settings
    if settings.llm_structured != AUTO:
        return f"{settings.llm_structured} (forced)"
    found = memory.wiring.output_rungs.rung(redact_url(settings.llm_url), settings.llm_model)
    return found.rung.value if found else "not yet known (json_schema is tried first)"


def llm_breaker(memory: Kenning) -> dict[str, Any] | None:
    """The LLM endpoint's circuit breaker, as the process that last changed it left it (`status`):
    `breaker` is `closed`, `open` (calls fail fast, `reason` says why) or `half-open` (its
    cooldown is over: the next call may try); and how extraction asks it for structured output
    (`structured_output`). None when no LLM endpoint is configured."""
    settings = memory.settings
    if not settings.llm_url:
        return None
    found = memory.wiring.spend.breaker(breaker_key(settings.llm_url, settings.llm_model))
    view: dict[str, Any] = {
        "endpoint": redact_url(settings.llm_url),
        "model": settings.llm_model,
        "structured_output": structured_output(memory),
    }
    if found is None:
        return {**view, "breaker": "closed", "reason": "", "since": None}
    state = found.now(utcnow())
    reason = found.reason if state != "closed" else ""
    return {**view, "breaker": state, "reason": reason, "since": found.changed_at.isoformat()}


def load_placement(memory: Kenning) -> dict[str, str] | None:
    """Where a distributed deployment's load workers may run (`status`): anywhere with a Qdrant
    server; with Qdrant Edge, only on the machine whose disk holds the vectors, sharing its home.
    None in embedded mode."""
    settings = memory.settings
    if settings.mode != "distributed":
        return None
    if settings.qdrant_url:
        return {"vectors": "qdrant", "load_workers": "any host"}
    where = str((settings.home / "vectors").resolve())
    return {
        "vectors": f"qdrant edge at {where}",
        "load_workers": "only on this machine, sharing KENNING_HOME: the vectors are on its disk",
    }
