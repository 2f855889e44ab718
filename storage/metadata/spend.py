"""The LLM spend ledger (and the breakers' states): in the SQL metadata database, and its in-memory twin."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.errors import StoreError
from kenning.pipeline.models import utcnow
from kenning.pipeline.ports import chunked
from kenning.pipeline.session import SessionKey
from kenning.pipeline.spend import Breaker, Charge, ChargeKind, Spend
from kenning.storage.metadata.schema import llm_attempt_datasets, llm_attempts, llm_breakers
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
        session = charge.session
        row = {
            "id": attempt_id,
            "run_id": charge.run_id,
            "dataset_id": charge.dataset_id,
            "model": model[:255],
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "sent_at": utcnow(),
            "kind": charge.kind,
            "tenant": session.tenant if session else "",
            "user_id": session.user if session else "",
            "session_id": session.session_id if session else "",
        }
        shares = [{"attempt_id": attempt_id, "dataset_id": dataset_id} for dataset_id in charge.shared]

        def write(conn: sa.Connection) -> None:
            conn.execute(sa.insert(llm_attempts), [row])
            if shares:  # in the attempt's transaction: it is charged to all its datasets or to none
                conn.execute(sa.insert(llm_attempt_datasets), shares)

        self._writes.run(write)

    def answered(self, attempt_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        table = llm_attempts
        update = (
            sa.update(table)
            .where(table.c.id == attempt_id)
            .values(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        )
        self._writes.run(lambda conn: conn.execute(update))

    def totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        found: dict[str, Spend] = {}
        for batch in chunked(list(dict.fromkeys(run_ids)), BATCH):
            for (run_id,), spend in self._sums([llm_attempts.c.run_id], llm_attempts.c.run_id.in_(batch)):
                found[run_id] = spend
        return found

    def by_dataset(self, dataset_ids: Sequence[str]) -> dict[str, dict[ChargeKind, Spend]]:
        table, shares = llm_attempts, llm_attempt_datasets
        shared = table.join(shares, shares.c.attempt_id == table.c.id)
        found: dict[str, dict[ChargeKind, Spend]] = {}
        for batch in chunked(list(dict.fromkeys(dataset_ids)), BATCH):
            first = self._sums([table.c.dataset_id, table.c.kind], table.c.dataset_id.in_(batch))
            others = self._sums([shares.c.dataset_id, table.c.kind], shares.c.dataset_id.in_(batch), shared)
            for (dataset_id, kind), spend in [*first, *others]:
                kinds = found.setdefault(dataset_id, {})
                kinds[kind] = kinds.get(kind, Spend()) + spend
        return found

    def across(self, dataset_ids: Sequence[str]) -> dict[ChargeKind, Spend]:
        table, shares = llm_attempts, llm_attempt_datasets
        wanted = list(dict.fromkeys(dataset_ids))
        if not wanted:
            return {}
        # One query (not batches), so that an attempt charged to datasets of two batches counts once.
        shared = sa.select(shares.c.attempt_id).where(shares.c.dataset_id.in_(wanted))
        where = table.c.dataset_id.in_(wanted) | table.c.id.in_(shared)
        return {kind: spend for (kind,), spend in self._sums([table.c.kind], where)}

    def by_session(self, keys: Sequence[SessionKey]) -> dict[SessionKey, dict[str, Spend]]:
        table = llm_attempts
        found: dict[SessionKey, dict[str, Spend]] = {}
        for batch in chunked(list(dict.fromkeys(keys)), BATCH):
            wanted = sa.tuple_(table.c.tenant, table.c.user_id, table.c.session_id).in_(
                [(key.tenant, key.user, key.session_id) for key in batch]
            )
            group = [table.c.tenant, table.c.user_id, table.c.session_id, table.c.model]
            for (tenant, user, session_id, model), spend in self._sums(group, wanted):
                key = SessionKey(tenant=tenant, user=user, session_id=session_id)
                found.setdefault(key, {})[model] = spend
        return found

    def charge_run(self, run_id: str, session: SessionKey) -> None:
        table = llm_attempts
        update = (
            sa.update(table)
            .where(table.c.run_id == run_id, table.c.session_id == "")
            .values(tenant=session.tenant, user_id=session.user, session_id=session.session_id)
        )
        self._writes.run(lambda conn: conn.execute(update))

    def _sums(
        self,
        group: Sequence[sa.ColumnElement[Any]],
        where: sa.ColumnElement[bool],
        source: sa.FromClause = llm_attempts,
    ) -> list[tuple[tuple[Any, ...], Spend]]:
        """The spend of the attempts `where` holds (in `source`: the attempts, or a join of them),
        per value of the `group` columns."""
        table = llm_attempts
        nothing_billed = (table.c.prompt_tokens == 0) & (table.c.completion_tokens == 0)
        query = (
            sa.select(
                *group,
                sa.func.count(),
                sa.func.sum(table.c.prompt_tokens),
                sa.func.sum(table.c.completion_tokens),
                sa.func.count().filter(nothing_billed),
            )
            .select_from(source)
            .where(where)
            .group_by(*group)
        )
        width = len(group)
        with translated_sql("spend ledger"), self._engine.connect() as conn:
            rows = conn.execute(query).all()
        return [
            (
                tuple(row[:width]),
                Spend(
                    int(row[width]), int(row[width + 1] or 0), int(row[width + 2] or 0), int(row[width + 3])
                ),
            )
            for row in rows
        ]

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
        self._attempts: dict[str, _Attempt] = {}
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
            self._attempts[attempt_id] = _Attempt(
                charge, model[:255], Spend(1, prompt_tokens, completion_tokens)
            )

    def answered(self, attempt_id: str, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            if attempt_id in self._attempts:
                failed = int(prompt_tokens == completion_tokens == 0)
                attempt = self._attempts[attempt_id]
                self._attempts[attempt_id] = replace(
                    attempt, spend=Spend(1, prompt_tokens, completion_tokens, failed)
                )

    def totals(self, run_ids: Sequence[str]) -> dict[str, Spend]:
        wanted = set(run_ids)
        sums = self._sums(lambda a: (a.charge.run_id,), lambda a: a.charge.run_id in wanted)
        return {run_id: spend for (run_id,), spend in sums.items()}

    def by_dataset(self, dataset_ids: Sequence[str]) -> dict[str, dict[ChargeKind, Spend]]:
        found: dict[str, dict[ChargeKind, Spend]] = {}
        for dataset_id in dict.fromkeys(dataset_ids):
            sums = self._sums(lambda a: (a.charge.kind,), partial(_is_charged, dataset=dataset_id))
            if sums:
                found[dataset_id] = {kind: spend for (kind,), spend in sums.items()}
        return found

    def across(self, dataset_ids: Sequence[str]) -> dict[ChargeKind, Spend]:
        wanted = set(dataset_ids)
        sums = self._sums(lambda a: (a.charge.kind,), lambda a: not wanted.isdisjoint(_charged(a)))
        return {kind: spend for (kind,), spend in sums.items()}

    def by_session(self, keys: Sequence[SessionKey]) -> dict[SessionKey, dict[str, Spend]]:
        wanted = set(keys)
        found: dict[SessionKey, dict[str, Spend]] = {}
        sums = self._sums(lambda a: (a.charge.session, a.model), lambda a: a.charge.session in wanted)
        for (session, model), spend in sums.items():
            found.setdefault(session, {})[model] = spend
        return found

    def charge_run(self, run_id: str, session: SessionKey) -> None:
        with self._lock:
            for attempt_id, attempt in self._attempts.items():
                if attempt.charge.run_id == run_id and attempt.charge.session is None:
                    charge = replace(attempt.charge, session=session)
                    self._attempts[attempt_id] = replace(attempt, charge=charge)

    def _sums(
        self, group: Callable[[_Attempt], tuple[Any, ...]], keep: Callable[[_Attempt], bool]
    ) -> dict[tuple[Any, ...], Spend]:
        """The spend of the attempts `keep` keeps, per value of `group`."""
        found: dict[tuple[Any, ...], Spend] = {}
        with self._lock:
            for attempt in self._attempts.values():
                if keep(attempt):
                    values = group(attempt)
                    found[values] = found.get(values, Spend()) + attempt.spend
        return found


@dataclass(frozen=True)
class _Attempt:
    charge: Charge
    model: str
    spend: Spend


def _charged(attempt: _Attempt) -> tuple[str, ...]:
    """Every dataset the attempt is charged to."""
    return (attempt.charge.dataset_id, *attempt.charge.shared)


def _is_charged(attempt: _Attempt, dataset: str) -> bool:
    return dataset in _charged(attempt)
