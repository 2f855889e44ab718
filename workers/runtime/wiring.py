"""The composition root: build every adapter from the settings, lazily, in the process that uses it."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import sqlalchemy as sa

from kenning.pipeline.context import PipelineConfig
from kenning.pipeline.errors import ConfigError, NoLLMConfigured, StoreError
from kenning.pipeline.ladder import OutputRungs
from kenning.pipeline.lexical import LexicalIndex
from kenning.pipeline.offline import OfflineExtractor
from kenning.pipeline.permission import PermissionStore
from kenning.pipeline.ports import (
    AccessLog,
    BlobStore,
    ChunkStore,
    Completer,
    Embedder,
    ExtractionCache,
    Extractor,
    GraphStore,
    Lock,
    MetadataStore,
    RunLock,
    VectorStore,
)
from kenning.pipeline.ratelimit import Limits, RateLimiter, provider_key
from kenning.pipeline.session import SessionRecords, SessionStore
from kenning.pipeline.spend import FailureTally, HeldLedger, SpendLedger
from kenning.storage.coordination.breaker_memory import MemoryFailureTally
from kenning.storage.coordination.forget_marks import FileForgetMark, ForgetMark
from kenning.storage.coordination.kept_lock import KeptRunLock
from kenning.storage.coordination.lock import FileLock
from kenning.storage.coordination.ratelimit_memory import MemoryRateLimiter
from kenning.storage.inference.embedder import CachingEmbedder, HashEmbedder, LocalEmbedder, OpenAIEmbedder
from kenning.storage.lexical.sql import SqlLexicalIndex
from kenning.storage.metadata.access import SqlAccessLog
from kenning.storage.metadata.permissions import SqlPermissionStore
from kenning.storage.metadata.rungs import SqlOutputRungs
from kenning.storage.metadata.session_records import SqlSessionRecords
from kenning.storage.metadata.spend import SqlSpendLedger
from kenning.storage.metadata.sql import SqlMetadataStore, migrate
from kenning.storage.sessions.file import FileSessionStore
from kenning.storage.sources.blob import FileBlobStore
from kenning.storage.sql.engine import open_engine
from kenning.workers.runtime.extras import needs_extra
from kenning.workers.runtime.heap import settle
from kenning.workers.runtime.keys import (
    breaker_prefix,
    forgets_key,
    lock_prefix,
    ratelimit_prefix,
    session_prefix,
)
from kenning.workers.runtime.local_runner import LocalRunner, ProgressCallback, no_progress
from kenning.workers.runtime.metrics import StepClock
from kenning.workers.runtime.settings import Settings, in_mode

T = TypeVar("T")
log = logging.getLogger(__name__)
_UNMADE = object()


class Wiring:
    """Implements `kenning.pipeline.context.Services`: each port is opened on first use, once.

    Opening lazily matters: Qdrant local mode allows one client per path, so a worker
    that never loads or queries must never open it.
    """

    def __init__(
        self, settings: Settings, overrides: dict[str, Any] | None = None, *, distributed: bool = False
    ) -> None:
        """`overrides` replaces ports by name (e.g. {"embedder": ...}): the injection point for
        tests and benchmarks. `distributed` forces `settings.mode` to distributed (`serve
        --distributed`, a Celery worker); `self.settings` holds the mode every surface follows."""
        self.settings = in_mode(settings, "distributed") if distributed else settings
        self._made: dict[str, Any] = dict(overrides or {})
        self._mutex = threading.Lock()
        self._making: dict[str, threading.RLock] = {}
        self._closers: list[Callable[[], None]] = []

    def _once(self, name: str, make: Callable[[], T]) -> T:
        """The port `name`, made by `make` on first use. Each port has its own lock, so a thread
        making one (an LLM client, a vector engine) holds up no thread using another."""
        made = self._made.get(name, _UNMADE)
        if made is not _UNMADE:
            return made  # type: ignore[no-any-return]
        with self._mutex:
            making = self._making.setdefault(name, threading.RLock())
        with making:
            if name not in self._made:
                self._made[name] = make()
            return self._made[name]  # type: ignore[no-any-return]

    def warm(self, *names: str) -> None:
        """Make those ports on a background thread, now, so that a run finds them made: an LLM
        client takes 0.1-0.2 s to import and build. An error is left for the run to meet and
        report where it uses the port."""

        def make() -> None:
            for name in names:
                with contextlib.suppress(Exception):
                    getattr(self, name)

        threading.Thread(target=make, name="kenning-warm", daemon=True).start()

    @property
    def distributed(self) -> bool:
        """Whether the mode is distributed: runs go to the Celery workers, and every process of
        the deployment shares the Redis run lock, limiter and LLM breaker."""
        return self.settings.mode == "distributed"

    @property
    def config(self) -> PipelineConfig:
        # Made once: tasks read it often, and making it compiles the fact rules.
        return self._once("config", lambda: self.settings.pipeline)

    @property
    def engine(self) -> sa.Engine:
        return self._once("engine", self._open_engine)

    def _open_engine(self) -> sa.Engine:
        if not self.settings.metadata_url:
            self.home()
        with needs_extra("this metadata store"):
            engine = open_engine(self.settings.metadata_dsn)
        migrate(engine)
        self._closers.append(engine.dispose)
        return engine

    @property
    def metadata(self) -> MetadataStore:
        return self._sql_metadata()

    @property
    def chunks(self) -> ChunkStore:
        return self._sql_metadata()

    @property
    def cache(self) -> ExtractionCache:
        return self._sql_metadata()

    def _sql_metadata(self) -> SqlMetadataStore:
        return self._once("metadata", lambda: SqlMetadataStore(self.engine))

    @property
    def blobs(self) -> BlobStore:
        mode = 0o600 if self.settings.home_private else 0o644
        return self._once("blobs", lambda: FileBlobStore(self.home() / "blobs", mode))

    @property
    def graph(self) -> GraphStore:
        return self._once("graph", self._open_graph)

    def _open_graph(self) -> GraphStore:
        store = open_graph(self.settings, self.engine)
        self._closers.append(store.close)
        return store

    @property
    def vectors(self) -> VectorStore:
        if not self.settings.qdrant_url:
            self.home()
        return self._once("vectors", self._open_vectors)

    def _open_vectors(self) -> VectorStore:
        settings = self.settings
        store: VectorStore
        if settings.vector_engine == "edge":
            from kenning.storage.vectors.edge import EdgeVectorStore
            from kenning.storage.vectors.local_import import import_local_qdrant

            store = EdgeVectorStore(settings.vector_path)
            # A home written by qdrant-client local mode keeps its vectors: they move over once.
            import_local_qdrant(settings.qdrant_path, store, settings.vector_path)
        else:
            from kenning.storage.vectors.qdrant import QdrantVectorStore

            if settings.qdrant_url:
                store = QdrantVectorStore(url=settings.qdrant_url, api_key=settings.qdrant_api_key or None)
            else:
                store = QdrantVectorStore(path=settings.qdrant_path)
        check_dimensions(store, self.embedder)
        self._closers.append(store.close)
        return store

    @property
    def lexical(self) -> LexicalIndex:
        return self._once("lexical", lambda: SqlLexicalIndex(self.engine))

    @property
    def embedder(self) -> Embedder:
        return self._once("embedder", self._open_embedder)

    def _open_embedder(self) -> Embedder:
        limiter = self.limiter if embeddings_share_llm_limit(self.settings) else None
        # The mark is made at the first embed, not here: an embedder needs no home of its own.
        return CachingEmbedder(open_embedder(self.settings, limiter), forgets=self._forget_mark_now)

    def _forget_mark_now(self) -> str:
        return self.forget_mark.current()

    @property
    def forget_mark(self) -> ForgetMark:
        """What every forget changes, so that each process drops what it keeps of embedded texts."""
        return self._once("forget_mark", self._open_forget_mark)

    def _open_forget_mark(self) -> ForgetMark:
        if not self.distributed:
            return FileForgetMark(self.home() / "forgets")
        with needs_extra("the shared forget mark"):
            from kenning.storage.coordination.forget_marks_redis import RedisForgetMark
            from kenning.storage.coordination.redis_client import QUICK_TIMEOUT_S, open_redis

        client = open_redis(self.settings.redis_url, timeout_s=QUICK_TIMEOUT_S)
        self._closers.append(client.close)
        return RedisForgetMark(client, forgets_key(self.settings.queue_prefix))

    def forget_embedded(self) -> None:
        """After a forget: drop the vectors this process keeps of the texts it embedded, and
        change the forget mark, so that every other process drops its own before its next embed."""
        embedder = self._made.get("embedder")
        if isinstance(embedder, CachingEmbedder):
            embedder.clear()
        try:
            self.forget_mark.advance()
        except StoreError as error:
            log.warning("the forget mark was not changed (other processes keep their embeddings): %s", error)

    @property
    def extractor(self) -> Extractor:
        return self._once(
            "extractor",
            lambda: open_extractor(self.settings, self.limiter, self.spend, self.breakers, self.output_rungs),
        )

    @property
    def output_rungs(self) -> OutputRungs:
        """How each LLM endpoint and model takes structured output, as extraction found it."""
        return self._once("output_rungs", lambda: SqlOutputRungs(self.engine))

    @property
    def completer(self) -> Completer:
        return self._once(
            "completer", lambda: open_completer(self.settings, self.limiter, self.spend, self.breakers)
        )

    @property
    def breakers(self) -> FailureTally:
        """The LLM endpoint's failures in a row: this process's, or (distributed) every worker's."""
        return self._once("breakers", self._open_breakers)

    def _open_breakers(self) -> FailureTally:
        if not self.distributed:
            return MemoryFailureTally()
        with needs_extra("the shared LLM breaker"):
            from kenning.storage.coordination.breaker_redis import RedisFailureTally
            from kenning.storage.coordination.redis_client import QUICK_TIMEOUT_S, open_redis

        # A Redis that does not answer costs an LLM call this much before its breaker counts alone.
        client = open_redis(self.settings.redis_url, timeout_s=QUICK_TIMEOUT_S)
        self._closers.append(client.close)
        return RedisFailureTally(client, prefix=breaker_prefix(self.settings.queue_prefix))

    @property
    def limiter(self) -> RateLimiter | None:
        return self._once("limiter", self._open_limiter)

    def _open_limiter(self) -> RateLimiter | None:
        settings = self.settings
        if not settings.llm_url or not (settings.llm_rpm or settings.llm_tpm):
            return None
        key = provider_key(settings.llm_url, settings.llm_model)
        limits = {key: Limits(rpm=settings.llm_rpm, tpm=settings.llm_tpm)}
        if not self.distributed:
            return MemoryRateLimiter(limits)
        with needs_extra("the shared rate limiter"):
            from kenning.storage.coordination.ratelimit_redis import RedisRateLimiter
            from kenning.storage.coordination.redis_client import open_redis

        client = open_redis(settings.redis_url)
        self._closers.append(client.close)
        return RedisRateLimiter(client, limits, prefix=ratelimit_prefix(settings.queue_prefix))

    @property
    def sessions(self) -> SessionStore | None:
        """The session memory, or None when sessions are off (`KENNING_SESSION_BACKEND=none`)."""
        return self._once("sessions", self._open_sessions)

    def _open_sessions(self) -> SessionStore | None:
        settings = self.settings
        if settings.session_backend == "none":
            return None
        if settings.session_backend == "file":
            return FileSessionStore(self.home() / "sessions", ttl_s=settings.session_ttl_s)
        with needs_extra("the Redis session store"):
            from kenning.storage.coordination.redis_client import open_redis
            from kenning.storage.sessions.redis import RedisSessionStore
        client = open_redis(settings.redis_url)
        self._closers.append(client.close)
        return RedisSessionStore(client, session_prefix(settings.queue_prefix), ttl_s=settings.session_ttl_s)

    @property
    def session_records(self) -> SessionRecords:
        """One record per session in the metadata database: activity, usage, errors."""
        return self._once("session_records", lambda: SqlSessionRecords(self.engine))

    @property
    def spend(self) -> HeldLedger:
        """Every LLM request of a run, recorded as it is sent (`kenning.pipeline.spend`); held while the
        metadata database is away, and written once it is back."""
        return self._once("spend", lambda: HeldLedger(SqlSpendLedger(self.engine)))

    @property
    def access(self) -> AccessLog:
        """When retrieved elements were last returned, for decay and prune."""
        return self._once("access", lambda: SqlAccessLog(self.engine))

    @property
    def permissions(self) -> PermissionStore:
        """Users, API keys and dataset grants, in the metadata database."""
        return self._once("permissions", lambda: SqlPermissionStore(self.engine))

    @property
    def lock(self) -> Lock:
        """The dataset lock every run, forget and improve of this process holds: distributed, the
        Redis run lock the Celery tasks hold (kept alive while held); embedded, a file lock."""
        return self._once("lock", self._open_lock)

    def _open_lock(self) -> Lock:
        if not self.distributed:
            return FileLock(self.home() / "locks")
        with needs_extra("the Redis run lock"):
            from kenning.storage.coordination.redis_client import open_redis

        client = open_redis(self.settings.redis_url)
        self._closers.append(client.close)
        return KeptRunLock(open_run_lock(client, self.settings))

    def runner(self, progress: ProgressCallback = no_progress) -> LocalRunner:
        """The embedded runner, as every surface that runs cognify in this process builds it: the
        LLM's pace (rpm) when one is configured, `progress` timed by a `StepClock` whose spans
        `LocalRunner.run` reports to the run metrics, and the extractor warmed meanwhile."""
        settings = self.settings
        settle()  # a run is long: keep its full collections short (workers.runtime.heap)
        self.warm("extractor")  # built while the documents are classified and chunked
        return LocalRunner(
            self,
            self.lock,
            concurrency=settings.concurrency,
            rpm=settings.llm_rpm if settings.llm_url else 0,
            lock_ttl_s=settings.lock_ttl_s,
            progress=(clock := StepClock(progress, settings.otel_endpoint)),
            ended=clock.ended,
        )

    def home(self) -> Path:
        """The embedded data directory, created on first use: a ConfigError naming KENNING_HOME when it
        cannot be created or written."""
        return self._once("home", lambda: usable_home(self.settings.home, self.settings.home_private))

    def flush_spend(self) -> None:
        """Write the LLM spend held while the metadata database was away, if any was recorded;
        `StoreError` if it is still away (what is left stays held)."""
        with self._mutex:
            spend = self._made.get("spend")
        if isinstance(spend, HeldLedger):
            spend.flush()

    def close(self) -> None:
        """Close every port made, once the makes in flight (a port being warmed) have ended."""
        with self._mutex:
            making = list(self._making.values())
        for lock in making:  # not under the mutex: a make in flight may make the ports it needs
            with lock:
                pass
        with self._mutex:
            for close in reversed(self._closers):
                close()
            self._closers.clear()
            self._made.clear()


def open_run_lock(client: Any, settings: Settings) -> RunLock:
    """The dataset run lock in Redis; its keys carry the queue prefix so that deployments sharing
    a Redis stay apart. Celery tasks and every other surface of a distributed deployment hold it."""
    from kenning.storage.coordination.run_lock import RedisRunLock

    return RedisRunLock(client, prefix=lock_prefix(settings.queue_prefix))


def usable_home(home: Path, private: bool = True) -> Path:
    """The home, created; `private`: only its owner may enter it, and files made from now on in
    this process are its owner's alone (the umask is tightened to 077)."""
    try:
        if private:
            os.umask(os.umask(0o077) | 0o077)
        home.mkdir(parents=True, exist_ok=True)
        if private:
            home.chmod(0o700)
        with tempfile.TemporaryFile(dir=home):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(
            f"KENNING_HOME: cannot use {str(home)!r} ({reason}), expected a writable directory"
        ) from error
    return home.resolve()


def open_graph(settings: Settings, engine: sa.Engine) -> GraphStore:
    with needs_extra(f"the {settings.graph_backend} graph backend"):
        return _open_graph_store(settings, engine)


def _open_graph_store(settings: Settings, engine: sa.Engine) -> GraphStore:
    if settings.graph_backend == "memgraph":
        from kenning.storage.graph.memgraph import MemgraphGraphStore

        return MemgraphGraphStore(settings.graph_url, settings.graph_user, settings.graph_password)
    if settings.graph_backend == "falkordb":
        from kenning.storage.graph.falkordb import FalkorGraphStore

        return FalkorGraphStore(settings.graph_url, graph_name=settings.graph_name)
    from kenning.storage.graph.sql import SqlGraphStore

    same_database = settings.graph_dsn == settings.metadata_dsn
    return SqlGraphStore(engine if same_database else open_engine(settings.graph_dsn))


def open_embedder(settings: Settings, limiter: RateLimiter | None = None) -> Embedder:
    """The configured embedder; an endpoint's requests wait for `limiter` under the LLM's key."""
    if settings.embedding_provider == "openai":
        return OpenAIEmbedder(
            settings.embedding_url,
            settings.embedding_api_key or "unused",
            settings.embedding_model,
            settings.embedding_dimension,
            limiter=limiter,
            limit_key=llm_limit_key(settings) if limiter is not None else "",
        )
    if settings.embedding_provider == "hash":
        return HashEmbedder(settings.embedding_dimension)
    return LocalEmbedder()


def open_extractor(
    settings: Settings,
    limiter: RateLimiter | None = None,
    ledger: SpendLedger | None = None,
    breakers: FailureTally | None = None,
    rungs: OutputRungs | None = None,
) -> Extractor:
    if not settings.llm_url:
        return OfflineExtractor()
    from kenning.storage.inference.llm_openai import OpenAIExtractor

    return OpenAIExtractor(llm_config(settings), limiter, llm_limit_key(settings), ledger, breakers, rungs)


def open_completer(
    settings: Settings,
    limiter: RateLimiter | None = None,
    ledger: SpendLedger | None = None,
    breakers: FailureTally | None = None,
) -> Completer:
    if not settings.llm_url:
        raise NoLLMConfigured(
            "no LLM is configured: set KENNING_LLM_URL (and KENNING_LLM_API_KEY) to an "
            "OpenAI-compatible endpoint, or ask for context only"
        )
    from kenning.storage.inference.llm_openai import OpenAICompleter

    return OpenAICompleter(llm_config(settings), limiter, llm_limit_key(settings), ledger, breakers)


def embeddings_share_llm_limit(settings: Settings) -> bool:
    """Embedding requests to the LLM's own endpoint (same host) count toward its rpm/tpm, as a
    provider counting every request of the endpoint does: chat calls alone would use it all."""
    if settings.embedding_provider != "openai" or not settings.llm_url:
        return False
    return urlsplit(str(settings.embedding_url)).netloc == urlsplit(str(settings.llm_url)).netloc


def llm_limit_key(settings: Settings) -> str:
    """`host/model`, or `host/model/tenant` when each tenant has its own budget."""
    tenant = settings.tenant if settings.llm_limit_per_tenant else ""
    return provider_key(settings.llm_url, settings.llm_model, tenant)


def llm_config(settings: Settings) -> Any:
    from kenning.storage.inference.llm_openai import LLMConfig

    return LLMConfig(
        base_url=settings.llm_url,
        api_key=settings.llm_api_key or "unused",
        model=settings.llm_model,
        timeout_s=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        deadline_s=settings.llm_deadline_s,
        breaker_failures=settings.llm_breaker_failures,
        breaker_cooldown_s=settings.llm_breaker_cooldown_s,
        structured=settings.llm_structured,
        entity_types=settings.entity_types,
    )


def check_dimensions(store: VectorStore, embedder: Embedder) -> None:
    """Every existing collection must have the embedder's size: a mismatch is an error at startup."""
    for name in store.list_collections():
        store.ensure_collection(name, embedder.dimension)
