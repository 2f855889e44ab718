"""A property of the one permission gate: over a few callers, datasets and operations, through the
Python facade and over HTTP, no caller ever sees text of a dataset it may not read at the moment
of the call: not in results, errors or session history, nor in data `improve` created; nor the
ids of its datasets, items or runs; and a record or run of such a dataset is answered exactly as
one that does not exist.

Each dataset's texts carry its marker; the model of who reads what is `GRANTS`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kenning.pipeline.errors import KenningError
from kenning.pipeline.models import Scope
from kenning.pipeline.permission import Caller, Permission, User, caller_of, issue_key
from kenning.workers.api import create_app
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from kenning.workers.runtime.wiring import Wiring
from tests.integration.test_s3 import s3_url as s3_url  # the moto server fixture

READ, WRITE, DELETE, SHARE = Permission
DATASETS = ("a", "b")
QUERY = "lighthouse keeper ledger"
# Who may read what in tenant acme; `other` is umbra's (it reads umbra's a).
GRANTS: dict[str, dict[str, set[Permission]]] = {
    "admin": {},
    "writer": {"a": {READ, WRITE}},
    "reader": {"a": {READ}},
    "both": {"a": {READ, WRITE}, "b": {READ}},
    "other": {"a": {READ, WRITE}},
}
PRIVATE = "MKPRIVATE"


def marker(tenant: str, dataset: str) -> str:
    return f"MK{tenant}{dataset}".upper()


def add_users(memory: Kenning) -> tuple[dict[str, str], dict[str, User]]:
    """Every user of GRANTS with its grants and one API key: (name -> token, name -> user)."""
    store = memory.wiring.permissions
    tokens, users = {}, {}
    for name, grants in GRANTS.items():
        user = User(tenant="umbra" if name == "other" else "acme", name=name, admin=name == "admin")
        store.add_user(user)
        for dataset, held in grants.items():
            store.grant(user, dataset, held)
        token, key = issue_key(user)
        store.add_key(key)
        tokens[name], users[name] = token, user
    return tokens, users


class Echo:
    """A completer whose answer is its whole prompt: whatever it was shown, it repeats."""

    def complete(self, system: str, prompt: str) -> str:
        return prompt


@dataclass
class World:
    memory: Kenning
    client: TestClient
    tokens: dict[str, str]
    users: dict[str, User]
    bucket: str

    def tenant(self, name: str) -> str:
        return "umbra" if name == "other" else "acme"

    def reads(self, name: str) -> set[str]:
        """The markers the caller may read now (its grants read afresh)."""
        user = self.users[name]
        caller = caller_of(self.memory.wiring.permissions, user)
        return {marker(user.tenant, d) for d in DATASETS if caller.may(READ, d)}

    def hidden(self, name: str) -> set[str]:
        every = {marker(t, d) for t in ("acme", "umbra") for d in DATASETS} | {PRIVATE}
        return every - self.reads(name)

    def ids(self) -> dict[tuple[str, str], set[str]]:
        """Per (tenant, dataset): the ids of the dataset, its items and its runs."""
        metadata = self.memory.wiring.metadata
        return {
            (tenant, d.name): {d.id}
            | {item.id for item in metadata.list_items(d.id)}
            | {run.id for run in metadata.list_runs(d.id)}
            for tenant in ("acme", "umbra")
            for d in metadata.list_datasets(tenant)
        }

    def hidden_ids(self, name: str) -> set[str]:
        """The ids of every dataset the caller may not read now, of its items and of its runs."""
        readable = self.reads(name)
        return {i for (t, d), ids in self.ids().items() if marker(t, d) not in readable for i in ids}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, s3_url: str) -> Iterator[World]:
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    s3: Any = boto3.client("s3", endpoint_url=s3_url)
    bucket = f"gate-{os.getpid()}-{time.monotonic_ns()}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="acme/r.txt", Body=b"An acme report on the lighthouse.")
    s3.put_object(Bucket=bucket, Key="private/p.txt", Body=f"{PRIVATE} lighthouse keeper".encode())
    home: Path = tmp_path_factory.mktemp("caller-gate")
    config = load_settings(
        home=home,
        embedding_provider="hash",
        tenant="acme",
        s3_endpoint_url=s3_url,
        s3_allow=f"s3://{bucket}/acme/=acme",
    )
    try:
        with Kenning(config, Wiring(config, {"completer": Echo()})) as memory:
            for tenant in ("acme", "umbra"):
                setup = memory.as_caller(Caller(tenant=tenant, user="setup", admin=True))
                for dataset in DATASETS:
                    setup.add_text(f"The {QUERY} of {dataset} says {marker(tenant, dataset)}.", dataset)
                    setup.cognify(dataset)
            tokens, users = add_users(memory)
            with TestClient(create_app(memory)) as client:
                yield World(memory, client, tokens, users, bucket)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


OPERATIONS = ("search", "recall", "session", "improve", "add_s3", "by_id", "listing", "revoke_b", "grant_b")
steps = st.lists(
    st.tuples(
        st.sampled_from(sorted(GRANTS)),
        st.sampled_from(OPERATIONS),
        st.sampled_from(["python", "http"]),
        st.lists(st.sampled_from(DATASETS), min_size=1, max_size=2, unique=True),
        st.sampled_from(["s1", "s2"]),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=steps)
@example(  # an answer over a and b, then b revoked: the session, recall and improve must hide it
    script=[
        ("both", "grant_b", "python", ["a"], "s1"),
        ("both", "search", "http", ["a", "b"], "s1"),
        ("both", "revoke_b", "python", ["a"], "s1"),
        ("both", "session", "python", ["a"], "s1"),
        ("both", "recall", "http", ["a"], "s1"),
        ("both", "search", "python", ["a"], "s1"),
        ("reader", "improve", "http", ["a"], "s1"),
        ("reader", "search", "http", ["a"], "s2"),
    ]
)
@example(  # records and runs by id, and what lists them, as readers of one dataset or none of these
    script=[
        ("reader", "by_id", "http", ["a"], "s1"),
        ("other", "listing", "http", ["a", "b"], "s1"),
        ("reader", "listing", "http", ["b", "a"], "s1"),
        ("other", "by_id", "python", ["a"], "s1"),
    ]
)
def test_no_caller_sees_text_of_a_dataset_it_may_not_read(world: World, script: list[Any]) -> None:
    for name, operation, surface, datasets, session in script:
        if operation in ("revoke_b", "grant_b"):  # `both`'s read on b: the next call must obey
            store = world.memory.wiring.permissions
            change = store.grant if operation == "grant_b" else store.revoke
            change(world.users["both"], "b", [READ])
            continue
        seen = call(world, name, operation, surface, datasets, session)
        for text in world.hidden(name) | world.hidden_ids(name):
            assert text not in seen, f"{name} saw {text} by {operation} over {surface}"
        stored = stored_texts(world)
        for (tenant, dataset), text in stored.items():
            others = {marker(t, d) for t in ("acme", "umbra") for d in DATASETS} - {marker(tenant, dataset)}
            assert not any(m in text for m in others | {PRIVATE}), f"{tenant}/{dataset} holds another's text"


def call(world: World, name: str, operation: str, surface: str, datasets: list[str], session: str) -> str:
    """Make the call as `name`; everything it was shown, as text."""
    if surface == "http":
        return over_http(world, name, operation, datasets, session)
    caller = caller_of(world.memory.wiring.permissions, world.users[name])
    memory = world.memory.as_caller(caller)
    try:
        if operation == "search":
            return memory.search(
                QUERY, "RAG_COMPLETION", datasets=datasets, session_id=session
            ).model_dump_json()
        if operation == "recall":
            return memory.recall(QUERY, datasets, session_id=session).model_dump_json()
        if operation == "session":
            return str([entry.model_dump_json() for entry in memory.get_session(session)])
        if operation == "improve":
            return memory.improve(datasets[0]).model_dump_json()
        if operation == "by_id":
            return records_by_id(world, memory, datasets[0])
        if operation == "listing":
            return str(memory.status()) + str([listed(memory, d) for d in datasets])
        return add_s3(world, memory.add_paths, datasets[0])
    except KenningError as error:
        return str(error)


def over_http(world: World, name: str, operation: str, datasets: list[str], session: str) -> str:
    client, auth = world.client, {"Authorization": f"Bearer {world.tokens[name]}"}
    if operation == "search":
        body = {"query": QUERY, "type": "RAG_COMPLETION", "datasets": datasets, "session_id": session}
        return client.post("/v1/search", headers=auth, json=body).text
    if operation == "recall":
        return client.post(
            "/v1/recall", headers=auth, json={"query": QUERY, "datasets": datasets, "session_id": session}
        ).text
    if operation == "session":
        return client.get(f"/v1/sessions/{session}", headers=auth).text
    if operation == "improve":  # not on HTTP: the operator improves, for everyone
        return world.memory.improve(datasets[0]).model_dump_json() and ""
    if operation == "by_id":
        return by_id_over_http(world, name, "records") + by_id_over_http(world, name, "runs")
    if operation == "listing":
        return listing_over_http(world, name, datasets)
    answer = client.post("/v1/add", headers=auth, json={"dataset": datasets[0], "uris": s3_uris(world)})
    if answer.status_code == 200:
        errors = answer.json()["errors"]
        assert errors[s3_uris(world)[1]] == errors[s3_uris(world)[2]]  # refused reads as missing
    return answer.text


MISSING = "0123456789abcdef0123456789abcdef"


def by_id_over_http(world: World, name: str, kind: str) -> str:
    """GET every record (or run) of every dataset by id: one the caller may not read is answered
    exactly as an id that names nothing (the id aside); what it may read, as text."""
    client, auth = world.client, {"Authorization": f"Bearer {world.tokens[name]}"}
    missing = client.get(f"/v1/{kind}/{MISSING}", headers=auth)
    assert missing.status_code == 404
    metadata, readable, seen = world.memory.wiring.metadata, world.reads(name), []
    for tenant, dataset in world.ids():
        found = metadata.get_dataset(Scope(tenant=tenant, dataset=dataset))
        assert found is not None
        listed = metadata.list_items(found.id) if kind == "records" else metadata.list_runs(found.id)
        for thing in listed:
            answer = client.get(f"/v1/{kind}/{thing.id}", headers=auth)
            if marker(tenant, dataset) in readable:
                assert answer.status_code == 200, answer.text
                seen.append(answer.text)
                continue
            as_missing = (answer.status_code, answer.text.replace(thing.id, MISSING))
            assert as_missing == (404, missing.text), f"{name}: {kind} of {tenant}/{dataset}"
    return "\n".join(seen)


def listing_over_http(world: World, name: str, datasets: list[str]) -> str:
    """What lists datasets, runs and records: a dataset the caller may not read is listed nowhere,
    and asking for its records is answered as for a dataset that does not exist."""
    client, auth = world.client, {"Authorization": f"Bearer {world.tokens[name]}"}
    caller = caller_of(world.memory.wiring.permissions, world.users[name])
    shown = client.get("/v1/datasets", headers=auth).json()["datasets"]
    assert all(caller.permissions(d["name"]) for d in shown)
    runs = client.get("/v1/runs", headers=auth).json()["runs"]
    assert all(caller.may(READ, run["dataset"]) for run in runs)
    seen = [str(shown), str(runs)]
    missing = client.get("/v1/records", headers=auth, params={"dataset": "zz"})
    for dataset in datasets:
        answer = client.get("/v1/records", headers=auth, params={"dataset": dataset})
        if caller.may(READ, dataset):
            seen.append(answer.text)
        else:
            as_missing = (answer.status_code, answer.text.replace(repr(dataset), repr("zz")))
            assert as_missing == (missing.status_code, missing.text)
    return "\n".join(seen)


def records_by_id(world: World, memory: Kenning, dataset: str) -> str:
    """Each item of every dataset, asked of the dataset named: what the caller was shown."""
    shown = []
    for ids in world.ids().values():
        for thing in sorted(ids):
            try:
                shown.append(memory.records.get(thing, dataset).model_dump_json())
            except KenningError as error:  # it names the id asked for, and nothing else
                shown.append(str(error).replace(thing, MISSING))
    return "\n".join(shown)


def listed(memory: Kenning, dataset: str) -> str:
    try:
        return memory.records.list(dataset).model_dump_json()
    except KenningError as error:
        return str(error)


def s3_uris(world: World) -> list[str]:
    return [f"s3://{world.bucket}/acme/", f"s3://{world.bucket}/private/", f"s3://missing-{world.bucket}/"]


def add_s3(world: World, add_paths: Any, dataset: str) -> str:
    result = add_paths(s3_uris(world), dataset)
    assert result.errors[s3_uris(world)[1]] == result.errors[s3_uris(world)[2]]
    return str(result.model_dump_json())


def stored_texts(world: World) -> dict[tuple[str, str], str]:
    metadata, blobs = world.memory.wiring.metadata, world.memory.wiring.blobs
    return {
        (tenant, d.name): "\n".join(
            blobs.get(item.content_hash).decode() for item in metadata.list_items(d.id)
        )
        for tenant in ("acme", "umbra")
        for d in metadata.list_datasets(tenant)
    }
