"""The in-memory twin of SqlPermissionStore, for tests and one-process use."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime

from kenning.pipeline.errors import Conflict
from kenning.pipeline.permission import ApiKey, Permission, User


class MemoryPermissionStore:
    """PermissionStore in dicts behind one lock."""

    def __init__(self) -> None:
        self._users: dict[str, User] = {}
        self._tenants: set[str] = set()
        self._keys: dict[str, ApiKey] = {}
        # (user id, dataset) -> permissions
        self._grants: dict[tuple[str, str], set[Permission]] = {}
        self._lock = threading.Lock()

    def add_user(self, user: User) -> None:
        with self._lock:
            if any(u.tenant == user.tenant and u.name == user.name for u in self._users.values()):
                raise Conflict(f"tenant {user.tenant!r} has a user {user.name!r} already")
            self._users[user.id] = user
            self._tenants.add(user.tenant)

    def get_user(self, tenant: str, name: str) -> User | None:
        with self._lock:
            return next((u for u in self._users.values() if u.tenant == tenant and u.name == name), None)

    def user_by_id(self, user_id: str) -> User | None:
        with self._lock:
            return self._users.get(user_id)

    def list_users(self, tenant: str) -> list[User]:
        with self._lock:
            return sorted((u for u in self._users.values() if u.tenant == tenant), key=lambda u: u.name)

    def list_tenants(self) -> list[str]:
        with self._lock:
            return sorted(self._tenants)

    def delete_user(self, user_id: str) -> bool:
        with self._lock:
            self._keys = {k: key for k, key in self._keys.items() if key.user_id != user_id}
            self._grants = {held: p for held, p in self._grants.items() if held[0] != user_id}
            return self._users.pop(user_id, None) is not None

    def add_key(self, key: ApiKey) -> None:
        with self._lock:
            self._keys[key.id] = key

    def get_key(self, key_id: str) -> ApiKey | None:
        with self._lock:
            return self._keys.get(key_id)

    def list_keys(self, user_id: str) -> list[ApiKey]:
        with self._lock:
            mine = (key for key in self._keys.values() if key.user_id == user_id)
            return sorted(mine, key=lambda key: key.created_at)

    def revoke_key(self, key_id: str, at: datetime) -> bool:
        with self._lock:
            key = self._keys.get(key_id)
            if key is None or key.revoked_at is not None:
                return False
            self._keys[key_id] = key.model_copy(update={"revoked_at": at})
            return True

    def grant(self, user: User, dataset: str, permissions: Iterable[Permission]) -> None:
        with self._lock:
            self._grants.setdefault((user.id, dataset), set()).update(Permission(p) for p in permissions)

    def revoke(self, user: User, dataset: str, permissions: Iterable[Permission]) -> None:
        with self._lock:
            held = self._grants.get((user.id, dataset), set())
            held.difference_update(Permission(p) for p in permissions)
            if not held:
                self._grants.pop((user.id, dataset), None)

    def grants_of(self, user_id: str) -> dict[str, frozenset[Permission]]:
        with self._lock:
            return {
                dataset: frozenset(held)
                for (owner, dataset), held in self._grants.items()
                if owner == user_id and held
            }

    def grants_on(self, tenant: str, dataset: str) -> dict[str, frozenset[Permission]]:
        with self._lock:
            return {
                self._users[owner].name: frozenset(held)
                for (owner, name), held in self._grants.items()
                if name == dataset and held and owner in self._users and self._users[owner].tenant == tenant
            }
