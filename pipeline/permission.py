"""Who may do what: users of a tenant, their API keys, and per-dataset permissions.

A user belongs to one tenant. Each of its API keys is a random token shown once; only the
token's SHA-256 is stored, and a presented token is compared with it in constant time. A
grant gives a user one permission (read, write, delete, share) on a dataset of its tenant,
named: it may name a dataset that does not exist yet, and stays when the dataset is forgotten.
A tenant's admins hold every permission on every dataset of their tenant.

What a caller may not read, it must not learn exists: `Caller.check` raises `NotFound` for a
dataset the caller may not see at all, and `Forbidden` only where it may read the dataset but
lacks the permission asked for.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from kenning.pipeline.errors import Forbidden, NotFound
from kenning.pipeline.models import utcnow

KEY_PREFIX = "kn"
# A read scope that no `tenant/dataset` key matches: the reader of no dataset. (An empty
# tuple of read scopes means "the caller's own tenant", so "nothing" needs a pattern.)
NO_DATASETS = ("",)
_GLOB = re.compile(r"([*?\[])")


class Permission(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    DELETE = "delete"
    SHARE = "share"


EVERY_PERMISSION = frozenset(Permission)


class User(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    # No `/` in a tenant: read scopes are `tenant/dataset` patterns.
    tenant: str = Field(min_length=1, max_length=255, pattern=r"^[^/\x00-\x1f\x7f]+$")
    name: str = Field(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f\x7f]+$")
    admin: bool = Field(default=False, description="Every permission on every dataset of its tenant")
    created_at: datetime = Field(default_factory=utcnow)


class ApiKey(BaseModel):
    """A stored key: its public id and the SHA-256 of the whole token, never the token."""

    model_config = ConfigDict(frozen=True)

    id: str
    user_id: str
    key_hash: str
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None

    def matches(self, token: str) -> bool:
        """Whether `token` is this key's, compared in constant time; a revoked key matches nothing."""
        return self.revoked_at is None and hmac.compare_digest(self.key_hash, digest(token))


class Caller(BaseModel):
    """One authenticated user as a request sees it: its tenant and what it may do to which dataset."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    user: str
    admin: bool = False
    grants: Mapping[str, frozenset[Permission]] = Field(default_factory=dict)
    scopes: tuple[str, ...] | None = Field(
        default=None,
        description="`tenant/dataset` globs it may read, when set (the local operator's "
        "KENNING_READ_SCOPES); None: exactly the datasets its grants let it read",
    )
    keyed: bool = Field(default=False, description="Authenticated by an API key (HTTP, MCP over HTTP)")

    def permissions(self, dataset: str) -> frozenset[Permission]:
        if self.admin:
            return EVERY_PERMISSION
        return self.grants.get(dataset, frozenset())

    def may(self, permission: Permission, dataset: str) -> bool:
        return permission in self.permissions(dataset)

    def check(self, permission: Permission, dataset: str) -> None:
        """Nothing if allowed; `Forbidden` if the caller may read the dataset, `NotFound` otherwise."""
        if self.may(permission, dataset):
            return
        if self.may(Permission.READ, dataset):
            raise Forbidden(f"{permission.value} on dataset {dataset!r} is not granted to you")
        raise NotFound(f"no dataset {dataset!r}")

    def granted(self, permission: Permission, datasets: Iterable[str]) -> list[str]:
        """Those of `datasets` the caller holds `permission` on, in their order."""
        return [name for name in datasets if self.may(permission, name)]

    def check_share(self, dataset: str, user: str, permissions: Iterable[Permission]) -> None:
        """Nothing if the caller may grant or revoke `permissions` of `user` on the dataset.

        Sharing changes other users' permissions, never the caller's own; only an admin grants
        or revokes `share` itself; anyone else grants or revokes only permissions it holds.
        `NotFound` where it may not read the dataset, `Forbidden` otherwise (see `check`)."""
        self.check(Permission.SHARE, dataset)
        wanted = frozenset(permissions)
        if user == self.user:
            raise Forbidden("sharing changes other users' permissions, never your own")
        if Permission.SHARE in wanted and not self.admin:
            raise Forbidden("only an admin grants or revokes share")
        lacking = wanted - self.shareable(dataset)
        if lacking:
            names = ", ".join(sorted(p.value for p in lacking))
            raise Forbidden(f"you may share only permissions you hold on {dataset!r}, not {names}")

    def shareable(self, dataset: str) -> frozenset[Permission]:
        """The permissions it may grant or revoke on the dataset (to others): an admin every one,
        anyone else those it holds but share; none without share."""
        if not self.may(Permission.SHARE, dataset):
            return frozenset()
        return EVERY_PERMISSION if self.admin else self.permissions(dataset) - {Permission.SHARE}

    def read_scopes(self) -> tuple[str, ...]:
        """`tenant/dataset` patterns of exactly the datasets it may read (`NO_DATASETS` if none),
        or its `scopes` when they are set."""
        if self.scopes is not None:
            return self.scopes or NO_DATASETS
        tenant = escape_glob(self.tenant)
        if self.admin:
            return (f"{tenant}/*",)
        readable = sorted(name for name, held in self.grants.items() if Permission.READ in held)
        return tuple(f"{tenant}/{escape_glob(name)}" for name in readable) or NO_DATASETS


class PermissionStore(Protocol):
    """Tenants, users, API keys and dataset grants."""

    def add_user(self, user: User) -> None:
        """Store the user (and its tenant); `Conflict` if the tenant has a user of that name."""
        ...

    def get_user(self, tenant: str, name: str) -> User | None: ...
    def user_by_id(self, user_id: str) -> User | None: ...
    def list_users(self, tenant: str) -> list[User]: ...
    def list_tenants(self) -> list[str]: ...
    def delete_user(self, user_id: str) -> bool:
        """Delete the user with its keys and grants; False if there was none."""
        ...

    def add_key(self, key: ApiKey) -> None: ...
    def get_key(self, key_id: str) -> ApiKey | None: ...
    def list_keys(self, user_id: str) -> list[ApiKey]: ...
    def revoke_key(self, key_id: str, at: datetime) -> bool:
        """Mark the key revoked; False when unknown or revoked already."""
        ...

    def grant(self, user: User, dataset: str, permissions: Iterable[Permission]) -> None: ...
    def revoke(self, user: User, dataset: str, permissions: Iterable[Permission]) -> None: ...
    def grants_of(self, user_id: str) -> dict[str, frozenset[Permission]]:
        """Dataset name -> the permissions the user holds on it."""
        ...

    def grants_on(self, tenant: str, dataset: str) -> dict[str, frozenset[Permission]]:
        """User name -> the permissions that user holds on the tenant's dataset."""
        ...


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_key(user: User) -> tuple[str, ApiKey]:
    """A new key for the user: the token (to show once) and the record to store."""
    key_id = secrets.token_hex(8)
    token = f"{KEY_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
    return token, ApiKey(id=key_id, user_id=user.id, key_hash=digest(token))


def key_id_of(token: str) -> str | None:
    """The public id inside a token, or None if it is not shaped like one."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


def authenticate(store: PermissionStore, token: str) -> Caller | None:
    """The caller a token stands for, read afresh (a revoked key fails at once); None if it fails."""
    key_id = key_id_of(token)
    key = store.get_key(key_id) if key_id else None
    if key is None or not key.matches(token):
        return None
    user = store.user_by_id(key.user_id)
    return caller_of(store, user).model_copy(update={"keyed": True}) if user else None


def caller_of(store: PermissionStore, user: User) -> Caller:
    return Caller(tenant=user.tenant, user=user.name, admin=user.admin, grants=store.grants_of(user.id))


def find_user(store: PermissionStore, tenant: str, name: str) -> User:
    user = store.get_user(tenant, name)
    if user is None:
        raise NotFound(f"no user {name!r} in tenant {tenant!r}")
    return user


def escape_glob(name: str) -> str:
    """`name` as a glob pattern matching itself alone (`*`, `?` and `[` made literal)."""
    return _GLOB.sub(r"[\1]", name)
