"""The one permission gate: what a caller may read and write, asked by every operation at the
moment it runs (grants read afresh per request take effect at once).

A caller is a `Caller`: a key's user (HTTP, MCP over HTTP), or the local operator (the CLI,
Python), who is an admin of the settings' tenant and reads what KENNING_READ_SCOPES allow.
What an operation writes cites every dataset it read: a session entry is shown only to a caller
that may read every dataset it cites.
"""

from __future__ import annotations

from collections.abc import Sequence

from kenning.pipeline.errors import Forbidden, NotFound
from kenning.pipeline.models import Dataset, Scope
from kenning.pipeline.permission import Caller, Permission, PermissionStore, caller_of
from kenning.pipeline.ports import MetadataStore
from kenning.pipeline.session import SessionEntry, SessionKey
from kenning.retrieval.contract import Principal, QueryBudget
from kenning.workers.runtime.settings import Settings
from kenning.workers.runtime.validation import S3Grant

# One answer for a bucket refused and a bucket that is not there: it tells nothing of either.
UNREADABLE_BUCKET = "no such bucket or prefix, or it may not be read here"


def operator(settings: Settings) -> Caller:
    """The local operator: the settings' tenant and user, an admin, reading KENNING_READ_SCOPES."""
    return Caller(tenant=settings.tenant, user=settings.user, admin=True, scopes=tuple(settings.readable))


def principal(caller: Caller, settings: Settings) -> Principal:
    """The caller as searches see it: its tenant, user and read scopes, and whether it may run
    Cypher (CYPHER, NATURAL_LANGUAGE: enabled, and its tenant listed), within what budget."""
    return Principal(
        tenant=caller.tenant,
        user=caller.user,
        read_scopes=caller.read_scopes(),
        may_run_cypher=settings.cypher_enabled
        and (not settings.cypher_tenants or caller.tenant in settings.cypher_tenants),
        cypher_budget=QueryBudget(timeout_ms=settings.cypher_timeout_ms, max_rows=settings.cypher_max_rows),
    )


def may_read(caller: Caller, scope: Scope) -> bool:
    return Principal(tenant=caller.tenant, user=caller.user, read_scopes=caller.read_scopes()).may_read(scope)


def may_write(caller: Caller, scope: Scope) -> bool:
    return scope.tenant == caller.tenant and caller.may(Permission.WRITE, scope.dataset)


def require_write(caller: Caller, scope: Scope) -> None:
    """Nothing if the caller may write the dataset; `Forbidden` where it may read it, else `NotFound`."""
    require(caller, Permission.WRITE, scope)


def holds(caller: Caller, permission: Permission, scope: Scope) -> bool:
    """Whether the caller holds `permission` on the dataset (of its own tenant)."""
    return scope.tenant == caller.tenant and caller.may(permission, scope.dataset)


def require(caller: Caller, permission: Permission, scope: Scope) -> None:
    """Nothing if the caller holds `permission` on the dataset; `Forbidden` where it may read it,
    else `NotFound` (a caller learns nothing of a dataset it may not read)."""
    if holds(caller, permission, scope):
        return
    if may_read(caller, scope):
        raise Forbidden(f"{permission.value} on dataset {scope.dataset!r} is not granted to you")
    raise NotFound(f"no dataset {scope.dataset!r}")


def readable_datasets(
    caller: Caller, metadata: MetadataStore, names: Sequence[str] | None = None
) -> list[str]:
    """Those of `names` (all, when None) that exist in the caller's tenant and it may read, in
    order; the others are left out silently."""
    existing = {d.name for d in metadata.list_datasets(caller.tenant)}
    wanted = sorted(existing) if names is None else [n for n in dict.fromkeys(names) if n in existing]
    return [name for name in wanted if may_read(caller, Scope(tenant=caller.tenant, dataset=name))]


def shows(caller: Caller, entry: SessionEntry) -> bool:
    """Whether the caller may see the session entry: it may read every dataset the entry cites."""
    return all(may_read(caller, Scope(tenant=caller.tenant, dataset=name)) for name in entry.cited)


def visible(caller: Caller, entries: Sequence[SessionEntry]) -> list[SessionEntry]:
    return [entry for entry in entries if shows(caller, entry)]


def wrote_as_writer(
    store: PermissionStore, key: SessionKey, dataset: Dataset, improver: Caller | None
) -> bool:
    """Whether the session's user may write the dataset now, so that `improve` may make its
    entries data of it. A user the permission store knows: by its grants now. A user it does not
    know (the local operator, say) counts as a writer only when it is the improving caller itself
    (same tenant and user), or when the deployment has no users at all."""
    user = store.get_user(key.tenant, key.user)
    if user is not None:
        return caller_of(store, user).may(Permission.WRITE, dataset.name) and user.tenant == dataset.tenant
    if improver is not None and (improver.tenant, improver.user) == (key.tenant, key.user):
        return True
    return not any(store.list_users(tenant) for tenant in store.list_tenants())


def may_read_bucket(caller: Caller, allowed: Sequence[S3Grant], bucket: str, prefix: str) -> bool:
    """Whether the caller may read `s3://bucket/prefix...`: under a prefix the allow-list maps to
    its tenant (prefixes match as written: `s3://b/docs/` is a folder, `s3://b/docs` matches
    `docs-old/` too). With no allow-list, only the local operator (not a key's caller) reads, and
    whatever its credentials reach."""
    if not allowed:
        return not caller.keyed
    return any(
        grant.tenant == caller.tenant and grant.bucket == bucket and prefix.startswith(grant.prefix)
        for grant in allowed
    )
