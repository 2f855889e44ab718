"""One contract for the permission store: memory, SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from kenning.pipeline.errors import Conflict, Forbidden, NotFound
from kenning.pipeline.models import Scope
from kenning.pipeline.permission import (
    NO_DATASETS,
    Caller,
    Permission,
    PermissionStore,
    User,
    authenticate,
    issue_key,
    key_id_of,
)
from kenning.retrieval.contract import Principal
from kenning.storage.metadata.permissions import SqlPermissionStore
from kenning.storage.metadata.permissions_memory import MemoryPermissionStore
from kenning.storage.metadata.sql import migrate
from kenning.storage.sql.engine import open_engine

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
READ, WRITE, DELETE, SHARE = Permission


@pytest.fixture(scope="module")
def postgres_engine(postgres_url: str) -> Iterator[sa.Engine]:
    """One migrated engine on the session's database; tests keep apart by unique tenants."""
    engine = open_engine(postgres_url)
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PermissionStore]:
    if request.param == "memory":
        yield MemoryPermissionStore()
        return
    if request.param == "postgres":
        yield SqlPermissionStore(request.getfixturevalue("postgres_engine"))
        return
    engine = open_engine(f"sqlite:///{tmp_path / 'metadata.db'}")
    migrate(engine)
    yield SqlPermissionStore(engine)
    engine.dispose()


@pytest.fixture
def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def test_users_are_unique_per_tenant(store: PermissionStore, tenant: str) -> None:
    # Given a user
    alice = User(tenant=tenant, name="alice")
    store.add_user(alice)

    # Then it is found by name and by id, and its tenant is listed
    assert store.get_user(tenant, "alice") == alice
    assert store.user_by_id(alice.id) == alice
    assert tenant in store.list_tenants()

    # And a second user of that name in the tenant is a conflict, while another tenant may have one
    with pytest.raises(Conflict):
        store.add_user(User(tenant=tenant, name="alice"))
    store.add_user(User(tenant=f"{tenant}-other", name="alice"))
    store.add_user(User(tenant=tenant, name="bob", admin=True))
    assert [u.name for u in store.list_users(tenant)] == ["alice", "bob"]
    assert store.get_user(tenant, "carol") is None


def test_keys_authenticate_until_revoked(store: PermissionStore, tenant: str) -> None:
    # Given a user with a key
    alice = User(tenant=tenant, name="alice")
    store.add_user(alice)
    token, key = issue_key(alice)
    store.add_key(key)

    # Then the token (and nothing else) stands for the user; only its hash was stored
    assert token not in key.model_dump_json()
    caller = authenticate(store, token)
    assert caller is not None and (caller.tenant, caller.user) == (tenant, "alice")
    assert authenticate(store, token[:-1] + ("A" if token[-1] != "A" else "B")) is None
    assert authenticate(store, "not a key") is None
    assert authenticate(store, f"kn_{'0' * 16}_secret") is None
    assert [k.id for k in store.list_keys(alice.id)] == [key_id_of(token)]

    # When the key is revoked, it fails at once, and revoking twice says so
    assert store.revoke_key(key.id, datetime.now(UTC))
    assert authenticate(store, token) is None
    assert not store.revoke_key(key.id, datetime.now(UTC))
    assert store.get_key(key.id) is not None and store.get_key(key.id).revoked_at is not None  # type: ignore[union-attr]


def test_grants_and_revokes(store: PermissionStore, tenant: str) -> None:
    alice, bob = User(tenant=tenant, name="alice"), User(tenant=tenant, name="bob")
    store.add_user(alice)
    store.add_user(bob)

    # When alice is granted read and write on notes, and bob read on notes and delete on logs
    store.grant(alice, "notes", [READ, WRITE])
    store.grant(alice, "notes", [READ])
    store.grant(bob, "notes", [READ])
    store.grant(bob, "logs", [DELETE])

    # Then each user's grants and each dataset's grantees are what was granted
    assert store.grants_of(alice.id) == {"notes": frozenset({READ, WRITE})}
    assert store.grants_of(bob.id) == {"notes": frozenset({READ}), "logs": frozenset({DELETE})}
    assert store.grants_on(tenant, "notes") == {"alice": frozenset({READ, WRITE}), "bob": frozenset({READ})}
    assert store.grants_on(f"{tenant}-other", "notes") == {}

    # When some are revoked, and bob is deleted
    store.revoke(alice, "notes", [WRITE, SHARE])
    store.revoke(bob, "logs", [DELETE])
    assert store.grants_of(alice.id) == {"notes": frozenset({READ})}
    token, key = issue_key(bob)
    store.add_key(key)
    assert store.delete_user(bob.id) and not store.delete_user(bob.id)

    # Then bob's grants and keys went with him
    assert store.grants_on(tenant, "notes") == {"alice": frozenset({READ})}
    assert authenticate(store, token) is None and store.list_keys(bob.id) == []


def test_caller_sees_exactly_its_grants() -> None:
    caller = Caller(
        tenant="acme", user="alice", grants={"notes": frozenset({READ}), "drop": frozenset({WRITE})}
    )

    # A dataset it may read but not change is forbidden; one it may not read is not found
    caller.check(READ, "notes")
    with pytest.raises(Forbidden):
        caller.check(DELETE, "notes")
    with pytest.raises(NotFound):
        caller.check(READ, "drop")
    with pytest.raises(NotFound):
        caller.check(WRITE, "secret")

    # Its read scopes match what it may read and nothing else, whatever the names hold
    tricky = Caller(tenant="a*", user="x", grants={"n[1]?": frozenset({READ})})
    principal = Principal(tenant="a*", read_scopes=tricky.read_scopes())
    assert principal.may_read(Scope(tenant="a*", dataset="n[1]?"))
    assert not principal.may_read(Scope(tenant="a*", dataset="n1x"))
    assert not principal.may_read(Scope(tenant="ab", dataset="n[1]?"))
    nobody = Principal(tenant="acme", read_scopes=Caller(tenant="acme", user="y").read_scopes())
    assert nobody.read_scopes == NO_DATASETS and not nobody.may_read(Scope(tenant="acme", dataset=""))
    admin = Caller(tenant="acme", user="root", admin=True)
    assert admin.may(SHARE, "anything") and admin.read_scopes() == ("acme/*",)
