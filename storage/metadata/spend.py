"""The LLM spend ledger (and the breakers' states): in the SQL metadata database, and its in-memory twin."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import utcnow
from kenning.pipeline.ports import chunked
from kenning.pipeline.spend import Breaker, Charge, Spend
from kenning.storage.metadata.schema import llm_attempts, llm_breakers
from kenning.storage.sql.errors import translated_sql

BATCH = 500


class _GroupCommit:
    """Writes from many threads committed together: each caller queues its write, and whichever
    caller commits next commits every write queued by then, in one transaction. When that
    transaction fails, each of its writes is tried again in a transaction of its own, so that one
    bad write fails alone. A caller returns once its own write is committed, or raises what
    failed it.

    Every LLM call writes twice (sent, answered): with 32 calls in flight that was 32 threads
    taking turns at the database one row at a time, holding the connections the load needed."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._queued: list[_Write] = []
        self._queue_lock = threading.Lock()
        self._commit_lock = threading.Lock()

    def run(self, write: Callable[[sa.Connection], object]) -> None:
        mine = _Write(write)
        with self._queue_lock:
            self._queued.append(mine)
        with self._commit_lock:
            if not mine.done:
                with self._queue_lock:
                    batch, self._queued = self._queued, []
                self._commit(batch)
        if mine.error is not None:
            raise mine.error
        if not mine.done:  # its batch was cut short (an interrupt): never report it written
            raise StoreError("spend ledger: the write was interrupted before it was committed")

    def _commit(self, batch: list[_Write]) -> None:
        try:
            self._transaction(batch)
        except Exception:  # noqa: BLE001  (each write is tried again alone)
            for queued in batch:
                try:
                    self._transaction([queued])
                except Exception as failed:  # noqa: BLE001  (raised by its caller)
                    queued.error = failed
        for queued in batch:
            queued.done = True

    def _transaction(self, writes: list[_Write]) -> None:
        with translated_sql("spend ledger"), self._engine.begin() as conn:
            for queued in writes:
                queued.write(conn)


@dataclass
class _Write:
    write: Callable[[sa.Connection], object]
    done: bool = False
    error: BaseException | None = None


class SqlSpendLedger:
    """`kenning.pipeline.spend.SpendLedger` in the `llm_attempts` table (run
    `kenning.storage.metadata.sql.migrate` first)."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._writes = _GroupCommit(engine)

    def sent(
        self, attempt_id: str, charge: Charge, model: str, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        row = {
            "id": attempt_id,
            "run_id": charge.run_id,
            "dataset_id": charge.dataset_id,
            "model": model[:255],
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "sent_at": utcnow(),
        }
        self._writes.run(lambda conn: conn.execute(sa.insert(llm_attempts), [row]))

    def answered(self, attempt_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        table = llm_attempts
        update = (
            sa.update(table)
            .where(table.c.id == attempt_id)
            .values(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        )
        self._writes.run(lambda conn: conn.execute(update))

    def totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        table = llm_attempts
        nothing_billed = (table.c.prompt_tokens == 0) & (table.c.completion_tokens == 0)
        found: dict[str, Spend] = {}
        with translated_sql("spend ledger"), self._engine.connect() as conn:
            for batch in chunked(list(dict.fromkeys(run_ids)), BATCH):
                query = (
                    sa.select(
                        table.c.run_id,
                        sa.func.count(),
                        sa.func.sum(table.c.prompt_tokens),
                        sa.func.sum(table.c.completion_tokens),
                        sa.func.count().filter(nothing_billed),
                    )
                    .where(table.c.run_id.in_(batch))
                    .group_by(table.c.run_id)
                )
                for run_id, calls, prompt, completion, failed in conn.execute(query):
                    found[run_id] = Spend(int(calls), int(prompt or 0), int(completion or 0), int(failed))
        return found

    def breaker_changed(self, endpoint: str, state: str, reason: str, cooldown_s: float) -> None:
        row = {
            "endpoint": endpoint[:512],
            "state": state,
            "reason": reason[:2000],
            "cooldown_s": cooldown_s,
            "changed_at": utcnow(),
        }
        insert = (postgresql if self._engine.dialect.name == "postgresql" else sqlite).insert(llm_breakers)
        upsert = insert.on_conflict_do_update(
            index_elements=["endpoint"], set_={key: insert.excluded[key] for key in row if key != "endpoint"}
        )
        with translated_sql("spend ledger"), self._engine.begin() as conn:
            conn.execute(upsert, [row])

    def breaker(self, endpoint: str) -> Breaker | None:
        table = llm_breakers
        query = sa.select(table.c.state, table.c.reason, table.c.cooldown_s, table.c.changed_at).where(
            table.c.endpoint == endpoint[:512]
        )
        with translated_sql("spend ledger"), self._engine.connect() as conn:
            row = conn.execute(query).first()
        return Breaker(row[0], row[1], float(row[2]), row[3]) if row else None


class MemorySpendLedger:
    """The in-memory twin of `SqlSpendLedger`."""

    def __init__(self) -> None:
        self._attempts: dict[str, tuple[str, Spend]] = {}
        self._breakers: dict[str, Breaker] = {}
        self._lock = threading.Lock()

    def breaker_changed(self, endpoint: str, state: str, reason: str, cooldown_s: float) -> None:
        with self._lock:
            self._breakers[endpoint] = Breaker(state, reason, cooldown_s, utcnow())

    def breaker(self, endpoint: str) -> Breaker | None:
        with self._lock:
            return self._breakers.get(endpoint)

    def sent(
        self, attempt_id: str, charge: Charge, model: str, prompt_tokens: int = 0, completion_tokens: int = 0
    ) -> None:
        with self._lock:
            if attempt_id in self._attempts:
                raise StoreError(f"spend ledger: attempt {attempt_id} is already recorded")
            self._attempts[attempt_id] = (charge.run_id, Spend(1, prompt_tokens, completion_tokens))

    def answered(self, attempt_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            if attempt_id in self._attempts:
                run_id, _ = self._attempts[attempt_id]
                failed = int(prompt_tokens == completion_tokens == 0)
                self._attempts[attempt_id] = (run_id, Spend(1, prompt_tokens, completion_tokens, failed))

    def totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        wanted = set(run_ids)
        found: dict[str, Spend] = {}
        with self._lock:
            for run_id, spend in self._attempts.values():
                if run_id in wanted:
                    found[run_id] = found.get(run_id, Spend()) + spend
        return found
