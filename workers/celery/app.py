"""The Celery app of the distributed pipeline, and how to start its workers.

Only the `app` object is made at import time. It reads the settings (`KENNING_*`) the
first time its configuration is needed, or takes them from `configure_app`; each worker
process opens its stores lazily, on its first task, and closes them when it exits.

Queues (`<prefix>` is `KENNING_QUEUE_PREFIX`, default `kenning`):

- `<prefix>.pipeline`: begin, classify, chunk, fan-out, gather, finish (metadata store only)
- `<prefix>.extract`: one task per batch of chunks (metadata store and the LLM)
- `<prefix>.load`: load and fk-edges, the only tasks that open the graph and vector stores
- `<prefix>.query`: `kenning.search`, the query worker (it opens the graph and vector stores)

Every worker needs the same settings as the process that enqueues work: the metadata
database (`KENNING_METADATA_URL`, PostgreSQL), the broker and result backend
(`KENNING_BROKER_URL`, `KENNING_RESULT_BACKEND`), `KENNING_REDIS_URL` for the dataset
lock, and a `KENNING_HOME` whose `blobs/` folder is shared with the process that adds data.
The tasks of a worker that dies come back after `KENNING_BROKER_VISIBILITY_TIMEOUT_S`
(default 2 hours), which must outlast the longest task, the load of a whole dataset. A run
does not wait for them: once no task of it has renewed a lease for `KENNING_LEASE_S`
(default 60 s), the supervisor every worker runs (`kenning.workers.celery.supervisor`, every
`KENNING_SUPERVISE_EVERY_S`) interrupts it, frees its lock and resumes its work in a new run.
Start each worker type with `kenning worker` (or the equivalent `celery` command):

    # pipeline steps and extraction: any number of these, on any hosts
    kenning worker --queues pipeline,extract --concurrency 4
    # extraction only, to add LLM throughput
    kenning worker --queues extract --concurrency 8
    # graph and vector writes
    kenning worker --queues load --concurrency 2
    # the same worker through celery itself (full queue names)
    celery -A workers.celery.app worker -Q kenning.pipeline,kenning.extract -c 4

With a Qdrant server (`KENNING_QDRANT_URL`) load workers scale like the others. Without
one, vectors live in Qdrant Edge under `KENNING_HOME/vectors`, which the processes of one
machine share by taking turns per collection; `kenning worker` runs a load worker as one
process with a thread pool, whose threads share each open collection without taking turns
(with `celery ... worker` pass `--pool threads` yourself). Qdrant local mode
(`KENNING_VECTOR_BACKEND=qdrant` without a server) admits one process per home: there, run
exactly one load worker. Extraction workers never open the vector store, so they may run anywhere.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

import redis
from celery import Celery
from celery.signals import before_task_publish, worker_process_init, worker_process_shutdown, worker_shutdown

from kenning.pipeline.errors import ConfigError
from kenning.pipeline.locking import lock_name
from kenning.pipeline.models import Scope
from kenning.pipeline.pacing import Metered, Pacer, Slots, window_of
from kenning.pipeline.ports import RunLock
from kenning.pipeline.tasks import Claim, Writing, ensure_collections
from kenning.storage.coordination.lease_redis import RedisLeases
from kenning.storage.coordination.queue_depth import queue_depths, waiting_with
from kenning.storage.coordination.redis_client import open_redis
from kenning.storage.coordination.run_lock import Deliveries
from kenning.storage.coordination.write_lock import one_writer
from kenning.workers.runtime import keys
from kenning.workers.runtime.heap import settle
from kenning.workers.runtime.metrics import metrics, serve_worker_metrics, wiring_llm
from kenning.workers.runtime.schedule import beat_schedule
from kenning.workers.runtime.settings import Settings, in_mode, load_settings
from kenning.workers.runtime.wiring import Wiring, open_run_lock

log = logging.getLogger(__name__)

# How long a run's claims on chunks outlive its last load part, if its end does not delete them.
CLAIMS_TTL_S = 3600
# Add the ids (ARGV[3..]) to the set, in order, until ARGV[1] were new; those new ones.
CLAIM_SCRIPT = """
local taken = {}
for i = 3, #ARGV do
  if #taken >= tonumber(ARGV[1]) then break end
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then taken[#taken + 1] = ARGV[i] end
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return taken
"""

MAX_TASKS_PER_CHILD = 500
# Waits for a Redis that went away: about a minute in all, then the task fails.
REDIS_RETRIES = 20
PUBLISH_RETRY = {"max_retries": 30, "interval_start": 0, "interval_step": 0.5, "interval_max": 2}
RESULT_EXPIRY_S = 24 * 3600


class Resources:
    """What the tasks of one worker process share: the wiring (every port), the dataset lock and
    the delivery counts."""

    def __init__(self, settings: Settings) -> None:
        self.wiring = Wiring(in_mode(settings, "distributed"))  # a worker is distributed, always
        self.settings = self.wiring.settings
        self._client: redis.Redis | None = None
        self._lock: RunLock | None = None
        self._deliveries: Deliveries | None = None
        self._leases: RedisLeases | None = None
        self._broker: redis.Redis | None = None
        self._slots: Slots | None = None
        self._mutex = threading.Lock()

    @property
    def slots(self) -> Slots:
        """The LLM calls this process's tasks keep in flight together (`pacing`): as many as the
        shared limit needs at the latency observed, within `KENNING_CONCURRENCY` and within what
        the LLM's server is seen to take at once."""
        with self._mutex:
            if self._slots is None:
                extractor = self.wiring.extractor
                metered = extractor if self.settings.llm_rpm and isinstance(extractor, Metered) else None
                pacer = Pacer(self.settings.llm_rpm, self.settings.concurrency, window=window_of(extractor))
                self._slots = Slots(pacer, metered)
            return self._slots

    @property
    def lock(self) -> RunLock:
        with self._mutex:
            if self._lock is None:
                self._lock = open_lock(self._redis(), self.settings)
            return self._lock

    @property
    def deliveries(self) -> Deliveries:
        with self._mutex:
            if self._deliveries is None:
                self._deliveries = open_deliveries(self._redis(), self.settings)
            return self._deliveries

    @property
    def leases(self) -> RedisLeases:
        with self._mutex:
            if self._leases is None:
                prefix = keys.lease_prefix(self.settings.queue_prefix)
                self._leases = RedisLeases(self._redis(), prefix)
            return self._leases

    def writing(self, scope: Scope) -> Writing:
        """The guard around each load write of the dataset: one at a time, across every worker."""
        name = keys.write_lock_prefix(self.settings.queue_prefix) + lock_name(scope)
        with self._mutex:
            client = self._redis()
        return lambda: one_writer(client, name)

    def claiming(self, run_id: str) -> Claim:
        """The run's load parts' claim on chunks (a Redis set per run): of the ids given, those
        no part took before, at most `limit`; none while Redis is away (the part then loads its
        own chunks only)."""
        with self._mutex:
            client = self._redis()
        key = keys.claims_prefix(self.settings.queue_prefix) + run_id
        script = client.register_script(CLAIM_SCRIPT)

        def claim(ids: Sequence[str], limit: int | None = None) -> list[str]:
            if not ids:
                return []
            try:
                taken = script(keys=[key], args=[limit or len(ids), CLAIMS_TTL_S, *ids])
            except redis.RedisError as error:
                log.warning("chunks of run %s not claimed: %s", run_id, error)
                return []
            return [value.decode() if isinstance(value, bytes) else str(value) for value in taken]

        return claim

    def forget_claims(self, run_id: str) -> None:
        with contextlib.suppress(redis.RedisError), self._mutex:
            self._redis().delete(keys.claims_prefix(self.settings.queue_prefix) + run_id)

    def waiting(self, run_id: str) -> int:
        """How many of the run's tasks wait in the broker's queues (0 if the broker is not Redis)."""
        with self._mutex:
            if self._broker is None and self.settings.broker_url.startswith("redis"):
                self._broker = open_redis(self.settings.broker_url)
        return waiting(self.settings, self._broker, run_id)

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = open_redis(self.settings.redis_url)
        return self._client

    def close(self) -> None:
        self.wiring.close()
        with self._mutex:
            for client in (self._client, self._broker):
                if client is not None:
                    client.close()
            self._client, self._lock, self._deliveries, self._leases = None, None, None, None
            self._broker, self._slots = None, None


def open_lock(client: redis.Redis, settings: Settings) -> RunLock:
    """The dataset lock; the very lock (and keys) `Wiring.lock` holds in distributed mode."""
    return open_run_lock(client, settings)


def open_deliveries(client: redis.Redis, settings: Settings) -> Deliveries:
    return Deliveries(client, prefix=keys.deliveries_prefix(settings.queue_prefix), expiry_s=RESULT_EXPIRY_S)


class KenningCelery(Celery):  # type: ignore[misc]  # celery ships no type hints
    """The Celery app: configured from the settings on first use, one `Resources` per process."""

    def __init__(self) -> None:
        super().__init__(
            "kenning", include=["kenning.workers.celery.tasks", "kenning.workers.services.tasks"]
        )
        self._settings: Settings | None = None
        self._resources: Resources | None = None
        self._resources_mutex = threading.Lock()

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self.on_configure()
        assert self._settings is not None
        return self._settings

    def on_configure(self) -> None:
        """Called by Celery the first time the configuration is read."""
        if self._settings is None:
            self._settings = in_mode(load_settings(), "distributed")
            self.config_from_object(celery_config(self._settings))

    def use_settings(self, settings: Settings) -> None:
        """Serve `settings`, in distributed mode whatever they say: the Celery app is the
        distributed runner."""
        settings = in_mode(settings, "distributed")
        if self._settings is not None and self._settings != settings:
            raise ConfigError(
                "the Celery app is already configured with other settings; "
                "one process serves one configuration"
            )
        if self._settings is None:
            self._settings = settings
            self.config_from_object(celery_config(settings))

    def resources(self) -> Resources:
        """This process's stores and lock, opened on first use."""
        with self._resources_mutex:
            if self._resources is None:
                self._resources = Resources(self.settings)
            return self._resources

    def forget_resources(self) -> None:
        """Drop resources inherited through fork without closing them: they belong to the parent."""
        with self._resources_mutex:
            self._resources = None

    def close_resources(self) -> None:
        with self._resources_mutex:
            resources, self._resources = self._resources, None
        if resources is not None:
            resources.close()


app = KenningCelery()


def configure_app(celery: KenningCelery, settings: Settings) -> None:
    """Configure the app from `settings` before its first use; other settings later are a `ConfigError`."""
    celery.use_settings(settings)


def queue_name(settings: Settings, kind: str) -> str:
    return keys.queue_name(settings.queue_prefix, kind)


def waiting(settings: Settings, broker: redis.Redis | None, run_id: str) -> int:
    """How many of the run's tasks wait in the queues of `broker` (None: a broker that is not
    Redis, which cannot be looked into: 0)."""
    return 0 if broker is None else waiting_with(broker, run_queues(settings), run_id)


def run_queues(settings: Settings) -> list[str]:
    """The queues a run's tasks go to."""
    return [queue_name(settings, kind) for kind in keys.QUEUE_KINDS if kind != "query"]


def tag_run(
    sender: str | None = None, body: Any = None, headers: dict[str, Any] | None = None, **_: Any
) -> None:
    """Name the run in the header of each of its task messages, so that the supervisor can tell
    a run whose tasks wait in the broker from a dead one (`Resources.waiting`)."""
    if headers is None or not (sender or "").startswith("kenning."):
        return
    run_id = run_of(body[0] if isinstance(body, (list, tuple)) and body else ())
    if run_id:
        headers[keys.RUN_HEADER] = run_id


def run_of(args: Any) -> str:
    """The run id a task's arguments carry: the first that is a job (`run_id`) or a message
    (`job.run_id`); a chord's body gets the results of its header before its message."""
    for value in args if isinstance(args, (list, tuple)) else ():
        job = value.get("job", value) if isinstance(value, dict) else None
        if isinstance(job, dict) and isinstance(job.get("run_id"), str):
            return str(job["run_id"])
    return ""


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings: acknowledge late, prefetch one, JSON only, `broker_options` for redelivery."""
    routes = {task: {"queue": queue_name(settings, kind)} for task, kind in keys.TASK_QUEUES.items()}
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # A task is acknowledged once done, so a worker lost mid-task has its task redelivered;
        # the broker redelivers unacknowledged tasks after the visibility timeout, which must
        # outlast the longest task.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "broker_transport_options": broker_options(settings),
        "broker_connection_retry_on_startup": True,
        # A Redis that restarts (or fails over) must not fail the tasks that finish meanwhile:
        # storing their results and sending the next task of the chain wait for it (bounded).
        "result_backend_always_retry": True,
        "result_backend_max_retries": REDIS_RETRIES,
        "task_publish_retry_policy": PUBLISH_RETRY,
        "worker_max_tasks_per_child": MAX_TASKS_PER_CHILD,
        "result_expires": RESULT_EXPIRY_S,
        "task_default_queue": queue_name(settings, "pipeline"),
        "beat_schedule": beat_schedule(settings.schedule),
        "task_routes": routes,
        "task_track_started": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
    }


def broker_options(settings: Settings) -> dict[str, Any]:
    """Redis transport options: when and how unacknowledged tasks come back.

    A task taken by a worker that died before acknowledging it is redelivered once it is older
    than the visibility timeout, so the timeout must outlast the longest task (and the longest
    retry countdown). Every worker looks for such tasks every few seconds. The keys that track
    them carry the queue prefix: a deployment never redelivers another one's running tasks.
    """
    timeout, prefix = settings.broker_visibility_timeout_s, settings.queue_prefix
    return {
        "visibility_timeout": timeout,
        **keys.unacked_keys(prefix),
        "unacked_restore_interval": min(10, max(1, int(timeout / 4))),
        "unacked_restore_throttle": 1,
    }


def worker_queues(settings: Settings, queues: str | None) -> list[str]:
    """Full queue names from a comma-separated list of kinds (`pipeline,extract`) or names; None = all."""
    if not queues:
        return [queue_name(settings, kind) for kind in keys.QUEUE_KINDS]
    names = []
    for entry in (part.strip() for part in queues.split(",")):
        if entry in keys.QUEUE_KINDS:
            names.append(queue_name(settings, entry))
        elif entry:
            names.append(entry)
    return names


def run_worker(queues: str | None, concurrency: int | None, loglevel: str) -> None:
    """Run a worker in this process until it is stopped (SIGTERM: finish current tasks, then exit)."""
    settings = load_settings()
    configure_app(app, settings)
    names = worker_queues(settings, queues)
    _QUEUES[:] = names  # for the pool processes, which warm up as they start
    pool, default = worker_pool(settings, names)
    argv = [
        "worker",
        f"--queues={','.join(names)}",
        f"--concurrency={concurrency or default}",
        f"--loglevel={loglevel}",
        f"--hostname={_node_name(names)}",
        f"--pool={pool}",
    ]
    if pool == "threads":
        warm_up(names)  # tasks run in this process: its ports are made before it says ready
        if settings.metrics_port:
            _serve_metrics(settings)  # no pool process starts: serve from here
    app.worker_main(argv)


# The queues this process's worker consumes, set as it starts.
_QUEUES: list[str] = []
# The ports each queue's tasks use, made as a worker starts rather than by its first tasks. The
# chunk step and load name the extractor too: the cache keys of extractions carry its model.
WARM_PORTS = {
    "pipeline": ("metadata", "chunks", "blobs", "extractor"),
    "extract": ("metadata", "chunks", "cache", "extractor", "limiter", "breakers", "spend"),
    "load": ("metadata", "chunks", "cache", "graph", "vectors", "lexical", "embedder", "extractor"),
}


def warm_up(queues: list[str]) -> None:
    """Make this process's resources and the ports its queues' tasks use (and, for loads, the
    vector collections), so that the first tasks of a run spend no time importing, connecting
    and creating. A port that fails to open is left for the task that uses it to meet and report."""
    resources = app.resources()
    kinds = [kind for kind in WARM_PORTS if queue_name(app.settings, kind) in queues]
    for name in warm_ports(kinds):
        try:
            getattr(resources.wiring, name)
        except Exception as error:  # noqa: BLE001 - reported by the task that needs the port
            log.warning("port %s not made at start: %s", name, error)
    if "extract" in kinds:
        with contextlib.suppress(Exception):
            resources.slots  # noqa: B018 - made now, not by the first batch
    if "load" in kinds:
        try:
            ensure_collections(resources.wiring)  # made now, not by the first load batch
        except Exception as error:  # noqa: BLE001 - reported by the load that needs them
            log.warning("vector collections not made at start: %s", error)


def warm_ports(kinds: Sequence[str]) -> list[str]:
    """The ports a worker of these queue kinds makes as it starts, each once."""
    return list(dict.fromkeys(port for kind in kinds for port in WARM_PORTS[kind]))


def worker_pool(settings: Settings, queues: list[str]) -> tuple[str, int]:
    """The pool a worker of `queues` runs its tasks in, and how many at once by default.

    Extraction waits on the LLM: its worker is one process whose threads run batches, and whose
    call slots (`Resources.slots`) keep up to `KENNING_CONCURRENCY` calls in flight; twice the
    batches that fill them, so the next batch is at hand when one ends. A load worker without a
    Qdrant server is one process too, whose threads share each open collection (Qdrant Edge on
    this machine's disk). Other workers are processes, two by default.
    """
    if queue_name(settings, "extract") in queues:
        return "threads", 2 * max(1, math.ceil(settings.concurrency / settings.extract_batch))
    if queue_name(settings, "load") in queues and not settings.qdrant_url:
        return "threads", 2
    return "prefork", 2


def _node_name(queues: list[str]) -> str:
    kinds = "+".join(name.rsplit(".", 1)[-1] for name in queues)
    return f"kenning-{kinds}-{os.getpid()}@{socket.gethostname()}"


def _on_process_start(**_: object) -> None:
    app.forget_resources()
    settle()
    warm_up(_QUEUES)
    if app.settings.metrics_port:
        _serve_metrics(app.settings)


def _serve_metrics(settings: Settings) -> None:
    if serve_worker_metrics(settings.metrics_port) is None:
        return
    # This process's LLM requests: the extractions of its chunks and the completions of its searches.
    metrics().watch_llm(lambda: wiring_llm(app.resources().wiring, settings.llm_url))
    if not settings.broker_url.startswith("redis"):
        return
    client = open_redis(settings.broker_url)
    queues = [queue_name(settings, kind) for kind in keys.QUEUE_KINDS]
    metrics().watch_queues(lambda: queue_depths(client, queues))


def _on_process_exit(**_: object) -> None:
    app.close_resources()


def _on_worker_exit(**_: object) -> None:
    app.close_resources()


before_task_publish.connect(tag_run, weak=False)
worker_process_init.connect(_on_process_start)
worker_process_shutdown.connect(_on_process_exit)
worker_shutdown.connect(_on_worker_exit)
