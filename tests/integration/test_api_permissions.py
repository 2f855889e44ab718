"""A property of the HTTP API: over random users, keys, grants and calls, nothing outside a
caller's grants is ever returned or changed, denials never tell a dataset exists, and a revoked
key fails at once.

The expectations come from a model of the rules written here (`Who`), not from the code under
test: a caller reads what it holds `read` on, an admin holds everything in its own tenant, and
no one holds anything in another tenant.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kenning.pipeline.models import Scope, utcnow
from kenning.pipeline.permission import Caller, Permission, User, issue_key
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings

READ, WRITE, DELETE, SHARE = Permission
TENANTS = ("acme", "umbra")
NAMES = ("d0", "d1", "d2", "d3")  # d3 exists nowhere until someone allowed adds to it
CREATED = {"acme": ("d0", "d1", "d2"), "umbra": ("d0", "d1")}
QUERY = "lighthouse keepers ledger"
MISSING = "no-such-item"


@dataclass
class World:
    memory: Kenning
    client: TestClient
    owner: dict[str, tuple[str, str]] = field(default_factory=dict)  # item id -> (tenant, dataset)
    runs: dict[tuple[str, str], str] = field(default_factory=dict)

    def marker(self, tenant: str, dataset: str) -> str:
        return f"mk{tenant}{dataset}"

    def items(self) -> dict[tuple[str, str], frozenset[str]]:
        """Every dataset's item ids, read from the store: what a call must not change."""
        metadata = self.memory.wiring.metadata
        return {
            (tenant, d.name): frozenset(item.id for item in metadata.list_items(d.id))
            for tenant in TENANTS
            for d in metadata.list_datasets(tenant)
        }

    def exists(self, tenant: str, dataset: str) -> bool:
        return self.memory.wiring.metadata.get_dataset(Scope(tenant=tenant, dataset=dataset)) is not None


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Two tenants with datasets of the same names, each item carrying its dataset's marker."""
    home: Path = tmp_path_factory.mktemp("api-permissions")
    with Kenning(load_settings(home=home, embedding_provider="hash")) as memory:
        with TestClient(create_app(memory)) as client:
            world = World(memory, client)
            for tenant, datasets in CREATED.items():
                setup = memory.as_caller(Caller(tenant=tenant, user="setup", admin=True))
                for dataset in datasets:
                    texts = [f"{world.marker(tenant, dataset)} holds {QUERY} page {n}." for n in range(2)]
                    for text in texts:
                        for item in setup.add_text(text, dataset).added:
                            world.owner[item.id] = (tenant, dataset)
                    world.runs[(tenant, dataset)] = setup.cognify(dataset).id
            yield world


@dataclass(frozen=True)
class Who:
    """One generated user: the model of what it may do."""

    name: str
    tenant: str
    admin: bool
    grants: dict[str, frozenset[Permission]]
    token: str

    def may(self, permission: Permission, dataset: str) -> bool:
        return self.admin or permission in self.grants.get(dataset, frozenset())

    def reads(self, tenant: str, dataset: str) -> bool:
        return tenant == self.tenant and self.may(READ, dataset)

    def denial(self, dataset: str) -> int:
        """A refused call: 403 where it may read the dataset, else 404, whatever exists."""
        return 403 if self.may(READ, dataset) else 404


users = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),
        st.sampled_from([False, False, False, True]),  # an admin now and then
        st.dictionaries(
            st.sampled_from(NAMES), st.frozensets(st.sampled_from(list(Permission)), min_size=1), max_size=4
        ),
    ),
    min_size=1,
    max_size=3,
)
KINDS = (
    "search",
    "recall",
    "records",
    "get",
    "update",
    "delete",
    "forget",
    "add",
    "cognify",
    "run",
    "grants",
    "datasets",
    "share",
    "revoke",
)
calls = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.sampled_from(KINDS),
        st.sampled_from(NAMES),
        st.none() | st.lists(st.sampled_from(NAMES), max_size=4),
        st.integers(0, 10_000),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=6,
)


def make_users(world: World, specs: list[tuple[str, bool, dict[str, frozenset[Permission]]]]) -> list[Who]:
    store = world.memory.wiring.permissions
    made = []
    for tenant, admin, grants in specs:
        user = User(tenant=tenant, name=f"u-{uuid.uuid4().hex[:8]}", admin=admin)
        store.add_user(user)
        for dataset, held in grants.items():
            store.grant(user, dataset, held)
        token, key = issue_key(user)
        store.add_key(key)
        made.append(Who(user.name, tenant, admin, {d: p for d, p in grants.items() if p}, token))
    return made


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(specs=users, script=calls)
def test_nothing_outside_a_callers_grants_is_returned_or_changed(
    world: World, specs: list[tuple[str, bool, dict[str, frozenset[Permission]]]], script: list[Any]
) -> None:
    people = make_users(world, specs)
    revoked: set[str] = set()
    for who_index, kind, dataset, datasets, pick, other_index in script:
        who = people[who_index % len(people)]
        other = people[other_index % len(people)]
        # Mostly an item of the caller's own tenant: where the grants decide
        mine = sorted(i for i, (tenant, _) in world.owner.items() if tenant == who.tenant)
        item = mine[pick % len(mine)] if pick % 3 else sorted(world.owner)[pick % len(world.owner)]
        before = world.items()
        event(kind)
        allowed_change = call(world, who, kind, dataset, datasets, item, other, revoked)
        after = world.items()
        for key in set(before) | set(after):
            if key != allowed_change:
                assert before.get(key) == after.get(key), f"{kind} by {who} changed {key}"


def call(
    world: World,
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
    revoked: set[str],
) -> tuple[str, str] | None:
    """Make one call as `who` and check its answer; the (tenant, dataset) it may have changed."""
    client, auth = world.client, {"Authorization": f"Bearer {who.token}"}
    if kind == "revoke":
        key_id = who.token.split("_")[1]
        world.memory.wiring.permissions.revoke_key(key_id, utcnow())
        revoked.add(who.token)
        return None
    if who.token in revoked:
        answer = client.get("/v1/me", headers=auth)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "unauthorized"
        return None
    checks = {
        "search": check_search,
        "recall": check_search,
        "records": check_records,
        "get": check_get,
        "update": check_change,
        "delete": check_change,
        "forget": check_forget,
        "add": check_add,
        "cognify": check_cognify,
        "run": check_run,
        "grants": check_grants,
        "datasets": check_datasets,
        "share": check_share,
    }
    return checks[kind](world, client, auth, who, kind, dataset, datasets, item, other)


def check_search(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    body: dict[str, Any] = {"query": QUERY, "datasets": datasets, "top_k": 20, "type": "CHUNKS"}
    answer = client.post(f"/v1/{kind}", headers=auth, json=body)
    assert answer.status_code == 200, answer.text
    hits = answer.json()["results"]
    for hit in hits:
        assert who.may(READ, hit["dataset"]), hit
        if hit["data_id"]:
            assert world.owner.get(hit["data_id"], (who.tenant, hit["dataset"])) == (
                who.tenant,
                hit["dataset"],
            )
        for tenant in TENANTS:
            for name in NAMES:
                if world.marker(tenant, name) in hit["text"]:
                    assert who.reads(tenant, name), hit
    wanted = NAMES if datasets is None else datasets
    if any(who.may(READ, name) and name in CREATED[who.tenant] for name in wanted):
        assert hits, "a readable dataset with items answers"
    return None


def check_records(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    answer = client.get("/v1/records", headers=auth, params={"dataset": dataset})
    if who.may(READ, dataset) and world.exists(who.tenant, dataset):
        assert answer.status_code == 200
        for record in answer.json()["records"]:
            # A record's id stays across its versions; its current version is a data item.
            assert world.owner.get(record["data_id"]) == (who.tenant, dataset)
    else:
        assert answer.status_code == 404, answer.text


def check_get(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    answer = client.get(f"/v1/records/{item}", headers=auth)
    assert answer.status_code == (200 if who.reads(*world.owner[item]) else 404), answer.text


def check_change(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    tenant, name = world.owner[item]
    needed = WRITE if kind == "update" else DELETE
    if tenant == who.tenant and who.may(needed, name):
        item = MISSING  # allowed: a harmless call, so the world stays as it is for the next example
        expected = 404
    else:
        expected = who.denial(name) if tenant == who.tenant else 404
    if kind == "update":
        answer = client.put(f"/v1/records/{item}", headers=auth, json={"text": "changed"})
    else:
        answer = client.delete(f"/v1/records/{item}", headers=auth)
    assert answer.status_code == expected, answer.text


def check_forget(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    body = {"dataset": dataset, "data_ids": [item]}
    if not who.may(DELETE, dataset):
        expected = who.denial(dataset)
    elif world.exists(who.tenant, dataset):
        body["data_ids"], expected = [MISSING], 200
    else:
        expected = 404
    answer = client.post("/v1/forget", headers=auth, json=body)
    assert answer.status_code == expected, answer.text
    if expected == 200:
        assert answer.json()["items"] == []


def check_add(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> tuple[str, str] | None:
    text = f"{world.marker(who.tenant, dataset)} added {uuid.uuid4().hex}"
    answer = client.post("/v1/add", headers=auth, json={"dataset": dataset, "texts": [text]})
    if not who.may(WRITE, dataset):
        assert answer.status_code == who.denial(dataset), answer.text
        return None
    assert answer.status_code == 200, answer.text
    for added in answer.json()["added"]:
        world.owner[added["id"]] = (who.tenant, dataset)
    return (who.tenant, dataset)


def check_cognify(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    if who.may(WRITE, dataset):
        return None  # allowed runs are the end-to-end tests' concern; here, only refusals
    answer = client.post("/v1/cognify", headers=auth, json={"dataset": dataset})
    assert answer.status_code == who.denial(dataset), answer.text


def check_run(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    tenant, name = world.owner[item]
    run_id = world.runs.get((tenant, name))  # none for a dataset an allowed add created
    answer = client.get(f"/v1/runs/{run_id or 'no-such-run'}", headers=auth)
    sees = run_id is not None and tenant == who.tenant and (who.may(READ, name) or who.may(WRITE, name))
    assert answer.status_code == (200 if sees else 404), answer.text


def check_grants(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    answer = client.get(f"/v1/datasets/{dataset}/permissions", headers=auth)
    if not who.may(SHARE, dataset):
        assert answer.status_code == who.denial(dataset), answer.text
        return
    assert answer.status_code == 200
    store = world.memory.wiring.permissions
    assert all(store.get_user(who.tenant, name) for name in answer.json()["grants"])


def check_datasets(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    listed = client.get("/v1/datasets", headers=auth).json()["datasets"]
    existing = {d.name for d in world.memory.wiring.metadata.list_datasets(who.tenant)}
    visible = (existing if who.admin else set()) | set(who.grants)
    assert {d["name"] for d in listed} == visible
    for entry in listed:
        assert entry["exists"] == (entry["name"] in existing)
        assert set(entry["permissions"]) == ({*Permission} if who.admin else who.grants[entry["name"]])


def check_share(
    world: World,
    client: TestClient,
    auth: dict[str, str],
    who: Who,
    kind: str,
    dataset: str,
    datasets: list[str] | None,
    item: str,
    other: Who,
) -> None:
    body = {"user": other.name, "permissions": ["read"]}
    answer = client.post(f"/v1/datasets/{dataset}/permissions", headers=auth, json=body)
    if not who.may(SHARE, dataset):
        assert answer.status_code == who.denial(dataset), answer.text
    elif other is who or not who.may(READ, dataset):
        assert answer.status_code == 403, answer.text  # never one's own, only what one holds
    elif other.tenant != who.tenant:
        assert answer.status_code == 404, answer.text  # a user of another tenant is no one here
    else:
        assert answer.status_code == 200, answer.text
        other.grants[dataset] = other.grants.get(dataset, frozenset()) | {READ}
