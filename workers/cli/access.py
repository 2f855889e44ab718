"""`kenning serve`, and who may use it: `kenning user`, `kenning key`, `kenning dataset share`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.console import Console

from kenning.pipeline.errors import NotFound
from kenning.pipeline.models import utcnow
from kenning.pipeline.permission import (
    Caller,
    Permission,
    PermissionStore,
    User,
    caller_of,
    find_user,
    issue_key,
    key_id_of,
)
from kenning.workers.cli.home import settings_for
from kenning.workers.cli.show import DATASET_NAME, USER_NAME, printable, safe
from kenning.workers.runtime.extras import needs_extra
from kenning.workers.runtime.settings import Settings
from kenning.workers.runtime.wiring import Wiring

console = Console(stderr=True)
PERMISSIONS = click.Choice([*(p.value for p in Permission), "all"], case_sensitive=False)
TENANT = click.option("--tenant", default=None, help="Default: KENNING_TENANT.")


@contextmanager
def permission_store(*, makes_home: bool = False) -> Iterator[tuple[PermissionStore, Settings]]:
    settings = settings_for(makes_home=makes_home)
    wiring = Wiring(settings)
    try:
        yield wiring.permissions, settings
    finally:
        wiring.close()


def chosen(permissions: tuple[str, ...]) -> list[Permission]:
    """The permissions named; `all`, or none named, is every one."""
    if not permissions or "all" in (p.lower() for p in permissions):
        return list(Permission)
    return [Permission(p.lower()) for p in permissions]


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--distributed", is_flag=True, help="Enqueue cognify runs on the Celery workers.")
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Processes answering, each with its own memory on the same home: searches use every core.",
)
def serve_command(host: str, port: int, distributed: bool, workers: int) -> None:
    """Answer the HTTP API (OpenAPI at /docs); every /v1 call needs a key from `kenning key create`."""
    with needs_extra("kenning serve"):
        from kenning.workers.api import serve
        from kenning.workers.api.app import serve_workers
        from kenning.workers.memory import Kenning

    if workers > 1:
        serve_workers(host, port, workers, distributed=distributed)
        return
    settings = settings_for(makes_home=True)
    with Kenning(settings, Wiring(settings, distributed=distributed)) as memory:
        serve(memory, host, port, distributed=distributed)


@click.group("user")
def user_group() -> None:
    """Users of a tenant, and the datasets they may use."""


@user_group.command("create")
@click.argument("name", type=USER_NAME)
@TENANT
@click.option("--admin", is_flag=True, help="Every permission on every dataset of the tenant.")
def user_create(name: str, tenant: str | None, admin: bool) -> None:
    with permission_store(makes_home=True) as (store, settings):
        user = User(tenant=tenant or settings.tenant, name=name, admin=admin)
        store.add_user(user)
    click.echo(printable(f"user {name} created in tenant {user.tenant}{' (admin)' if admin else ''}"))


@user_group.command("list")
@TENANT
def user_list(tenant: str | None) -> None:
    with permission_store() as (store, settings):
        for user in store.list_users(tenant or settings.tenant):
            grants = store.grants_of(user.id)
            held = ", ".join(f"{name}: {'+'.join(sorted(p))}" for name, p in sorted(grants.items()))
            role = "admin" if user.admin else held or "no grants"
            keys = sum(1 for key in store.list_keys(user.id) if key.revoked_at is None)
            click.echo(f"{printable(user.name)}\t{printable(role)}\t{keys} key(s)")


@user_group.command("delete")
@click.argument("name", type=USER_NAME)
@TENANT
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def user_delete(name: str, tenant: str | None, yes: bool) -> None:
    """Delete a user with its keys and grants (its data stays in the datasets)."""
    if not yes:
        click.confirm(f"delete user {name} and its keys?", abort=True)
    with permission_store() as (store, settings):
        store.delete_user(find_user(store, tenant or settings.tenant, name).id)
    click.echo(printable(f"user {name} deleted"))


@user_group.command("grant")
@click.argument("name", type=USER_NAME)
@click.argument("dataset", type=DATASET_NAME)
@click.option("--permission", "permissions", multiple=True, type=PERMISSIONS, help="Repeatable; default all.")
@TENANT
def user_grant(name: str, dataset: str, permissions: tuple[str, ...], tenant: str | None) -> None:
    """Grant a user permissions on a dataset (which need not exist yet)."""
    share(dataset, name, permissions, tenant, revoke=False)


@user_group.command("revoke")
@click.argument("name", type=USER_NAME)
@click.argument("dataset", type=DATASET_NAME)
@click.option("--permission", "permissions", multiple=True, type=PERMISSIONS, help="Repeatable; default all.")
@TENANT
def user_revoke(name: str, dataset: str, permissions: tuple[str, ...], tenant: str | None) -> None:
    """Revoke a user's permissions on a dataset; effective at its next request."""
    share(dataset, name, permissions, tenant, revoke=True)


@click.group("key")
def key_group() -> None:
    """API keys: `Authorization: Bearer <key>` on every /v1 request."""


@key_group.command("create")
@click.option("--user", "name", required=True, type=USER_NAME)
@TENANT
def key_create(name: str, tenant: str | None) -> None:
    """Create a key for the user and print it; it is shown this once (only its hash is kept)."""
    with permission_store() as (store, settings):
        user = find_user(store, tenant or settings.tenant, name)
        token, key = issue_key(user)
        store.add_key(key)
    console.print(safe(f"key {key.id} for {name} (tenant {user.tenant}); it is not shown again:"))
    click.echo(token)


@key_group.command("list")
@click.option("--user", "name", required=True, type=USER_NAME)
@TENANT
def key_list(name: str, tenant: str | None) -> None:
    with permission_store() as (store, settings):
        for key in store.list_keys(find_user(store, tenant or settings.tenant, name).id):
            state = f"revoked {key.revoked_at:%Y-%m-%d %H:%M}" if key.revoked_at else "active"
            click.echo(f"{key.id}\tcreated {key.created_at:%Y-%m-%d %H:%M}\t{state}")


@key_group.command("revoke")
@click.argument("key")
def key_revoke(key: str) -> None:
    """Revoke a key (by its id, or the whole key); it stops working at once."""
    key_id = key_id_of(key) or key
    with permission_store() as (store, _settings):
        if not store.revoke_key(key_id, utcnow()):
            raise NotFound(f"no active key {key_id!r}")
    click.echo(printable(f"key {key_id} revoked"))


@click.group("dataset")
def dataset_group() -> None:
    """Who may use a dataset."""


@dataset_group.command("share")
@click.argument("dataset", type=DATASET_NAME)
@click.option("--user", "name", required=True, type=USER_NAME)
@click.option(
    "--permission", "permissions", multiple=True, type=PERMISSIONS, help="Repeatable; default read."
)
@click.option("--revoke", is_flag=True, help="Take the permissions back instead (default: all of them).")
@TENANT
def dataset_share(
    dataset: str, name: str, permissions: tuple[str, ...], revoke: bool, tenant: str | None
) -> None:
    """Share a dataset with a user of its tenant: read (default), write, delete, share, or all."""
    share(dataset, name, permissions or (() if revoke else ("read",)), tenant, revoke=revoke)


@dataset_group.command("permissions")
@click.argument("dataset", type=DATASET_NAME)
@TENANT
def dataset_permissions(dataset: str, tenant: str | None) -> None:
    """Who holds which permission on the dataset (besides the tenant's admins)."""
    with permission_store() as (store, settings):
        for name, held in sorted(store.grants_on(tenant or settings.tenant, dataset).items()):
            click.echo(printable(f"{name}\t{', '.join(sorted(held))}"))


def share(dataset: str, name: str, permissions: tuple[str, ...], tenant: str | None, *, revoke: bool) -> None:
    """Grant or revoke, by the rule of `Caller.check_share` for the command line's caller; a revoke
    naming no permission takes back all that caller may revoke."""
    with permission_store() as (store, settings):
        caller = cli_caller(store, settings, tenant or settings.tenant)
        wanted = sorted(caller.shareable(dataset)) if revoke and not permissions else chosen(permissions)
        caller.check_share(dataset, name, wanted)
        user = find_user(store, caller.tenant, name)
        if revoke:
            store.revoke(user, dataset, wanted)
        else:
            store.grant(user, dataset, wanted)
        held = sorted(store.grants_of(user.id).get(dataset, frozenset()))
    click.echo(printable(f"{name} on {dataset}: {', '.join(held) or 'nothing'}"))


def cli_caller(store: PermissionStore, settings: Settings, tenant: str) -> Caller:
    """Who the command line acts as in the tenant: the user KENNING_USER names, where the tenant
    has a user of that name; else the operator, who holds every permission there."""
    user = store.get_user(tenant, settings.user)
    return caller_of(store, user) if user else Caller(tenant=tenant, user=settings.user, admin=True)


COMMANDS = (serve_command, user_group, key_group, dataset_group)
