"""Tenants, users, API keys and dataset grants in the SQL metadata database (SQLite or PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from kenning.pipeline.errors import Conflict
from kenning.pipeline.models import utcnow
from kenning.pipeline.permission import ApiKey, Permission, User
from kenning.storage.metadata.schema import api_keys, dataset_grants, tenants, users
from kenning.storage.sql.errors import translated_sql

WHAT = "permission store"


class SqlPermissionStore:
    """PermissionStore in the `tenants`, `users`, `api_keys` and `dataset_grants` tables (run
    `metadata_sql.migrate(engine)` first). Nothing is cached: a revoked key or grant counts at once."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine

    def _insert(self, table: sa.Table) -> Any:
        dialect = postgresql if self._engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(table)

    def add_user(self, user: User) -> None:
        tenant = {"name": user.tenant, "created_at": utcnow()}
        with translated_sql(WHAT), self._engine.begin() as conn:
            conn.execute(self._insert(tenants).values(tenant).on_conflict_do_nothing())
            insert = self._insert(users).values(user.model_dump()).on_conflict_do_nothing()
            added = conn.execute(insert.returning(users.c.id)).first()
        if added is None:
            raise Conflict(f"tenant {user.tenant!r} has a user {user.name!r} already")

    def get_user(self, tenant: str, name: str) -> User | None:
        return self._one_user(sa.and_(users.c.tenant == tenant, users.c.name == name))

    def user_by_id(self, user_id: str) -> User | None:
        return self._one_user(users.c.id == user_id)

    def _one_user(self, where: sa.ColumnElement[bool]) -> User | None:
        with translated_sql(WHAT), self._engine.connect() as conn:
            row = conn.execute(sa.select(users).where(where)).first()
        return User.model_validate(row._asdict()) if row else None

    def list_users(self, tenant: str) -> list[User]:
        query = sa.select(users).where(users.c.tenant == tenant).order_by(users.c.name)
        with translated_sql(WHAT), self._engine.connect() as conn:
            return [User.model_validate(row._asdict()) for row in conn.execute(query)]

    def list_tenants(self) -> list[str]:
        with translated_sql(WHAT), self._engine.connect() as conn:
            return list(conn.execute(sa.select(tenants.c.name).order_by(tenants.c.name)).scalars())

    def delete_user(self, user_id: str) -> bool:
        with translated_sql(WHAT), self._engine.begin() as conn:
            conn.execute(sa.delete(api_keys).where(api_keys.c.user_id == user_id))
            conn.execute(sa.delete(dataset_grants).where(dataset_grants.c.user_id == user_id))
            return bool(conn.execute(sa.delete(users).where(users.c.id == user_id)).rowcount)

    def add_key(self, key: ApiKey) -> None:
        with translated_sql(WHAT), self._engine.begin() as conn:
            conn.execute(sa.insert(api_keys).values(key.model_dump()))

    def get_key(self, key_id: str) -> ApiKey | None:
        with translated_sql(WHAT), self._engine.connect() as conn:
            row = conn.execute(sa.select(api_keys).where(api_keys.c.id == key_id)).first()
        return ApiKey.model_validate(row._asdict()) if row else None

    def list_keys(self, user_id: str) -> list[ApiKey]:
        query = sa.select(api_keys).where(api_keys.c.user_id == user_id).order_by(api_keys.c.created_at)
        with translated_sql(WHAT), self._engine.connect() as conn:
            return [ApiKey.model_validate(row._asdict()) for row in conn.execute(query)]

    def revoke_key(self, key_id: str, at: datetime) -> bool:
        live = sa.and_(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
        with translated_sql(WHAT), self._engine.begin() as conn:
            return bool(conn.execute(sa.update(api_keys).where(live).values(revoked_at=at)).rowcount)

    def grant(self, user: User, dataset: str, permissions: Iterable[Permission]) -> None:
        rows = [
            {"user_id": user.id, "dataset": dataset, "permission": Permission(p).value, "tenant": user.tenant}
            for p in set(permissions)
        ]
        if not rows:
            return
        with translated_sql(WHAT), self._engine.begin() as conn:
            conn.execute(self._insert(dataset_grants).on_conflict_do_nothing(), rows)

    def revoke(self, user: User, dataset: str, permissions: Iterable[Permission]) -> None:
        names = [Permission(p).value for p in set(permissions)]
        table = dataset_grants
        mine = sa.and_(table.c.user_id == user.id, table.c.dataset == dataset, table.c.permission.in_(names))
        with translated_sql(WHAT), self._engine.begin() as conn:
            conn.execute(sa.delete(table).where(mine))

    def grants_of(self, user_id: str) -> dict[str, frozenset[Permission]]:
        table = dataset_grants
        query = sa.select(table.c.dataset, table.c.permission).where(table.c.user_id == user_id)
        with translated_sql(WHAT), self._engine.connect() as conn:
            return _grouped(conn.execute(query))

    def grants_on(self, tenant: str, dataset: str) -> dict[str, frozenset[Permission]]:
        table = dataset_grants
        query = (
            sa.select(users.c.name, table.c.permission)
            .join(users, users.c.id == table.c.user_id)
            .where(table.c.tenant == tenant, table.c.dataset == dataset)
        )
        with translated_sql(WHAT), self._engine.connect() as conn:
            return _grouped(conn.execute(query))


def _grouped(rows: Iterable[Any]) -> dict[str, frozenset[Permission]]:
    found: dict[str, set[Permission]] = {}
    for name, permission in rows:
        found.setdefault(name, set()).add(Permission(permission))
    return {name: frozenset(held) for name, held in found.items()}
