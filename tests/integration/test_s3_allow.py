"""KENNING_S3_ALLOW: which tenant's callers may add from which bucket prefix, against a moto S3
server on 127.0.0.1. A refused bucket and a missing one give one and the same error."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from fastapi.testclient import TestClient

from kenning.pipeline.errors import ConfigError
from kenning.pipeline.permission import Permission, User, issue_key
from kenning.workers.api import create_app
from kenning.workers.application.gate import UNREADABLE_BUCKET
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.integration.test_s3 import s3_url as s3_url  # the moto server fixture

READ, WRITE, DELETE, SHARE = Permission


@pytest.fixture
def buckets(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Two buckets: `shared` holds each tenant's folder, `private` is no tenant's."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client: Any = boto3.client("s3", endpoint_url=s3_url)
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    shared, private = f"shared-{stamp}", f"private-{stamp}"
    for bucket in (shared, private):
        client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=shared, Key="acme/a.txt", Body=b"Acme's own report.")
    client.put_object(Bucket=shared, Key="umbra/u.txt", Body=b"Umbra's own report.")
    client.put_object(Bucket=private, Key="p.txt", Body=b"The operator's private notes.")
    return shared, private


def keyed(memory: Kenning, tenant: str) -> dict[str, str]:
    user = User(tenant=tenant, name="writer")
    store = memory.wiring.permissions
    store.add_user(user)
    store.grant(user, "docs", [READ, WRITE])
    token, key = issue_key(user)
    store.add_key(key)
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def served(tmp_path: Path, s3_url: str, buckets: tuple[str, str]) -> Iterator[tuple[Kenning, TestClient]]:
    shared, _ = buckets
    allow = f"s3://{shared}/acme/=acme,s3://{shared}/umbra/=umbra"
    settings = load_settings(
        home=tmp_path / "home", embedding_provider="hash", s3_endpoint_url=s3_url, s3_allow=allow
    )
    with Kenning(settings) as memory, TestClient(create_app(memory)) as client:
        yield memory, client


def add(client: TestClient, auth: dict[str, str], *uris: str) -> dict[str, Any]:
    answer = client.post("/v1/add", headers=auth, json={"dataset": "docs", "uris": list(uris)})
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_each_tenant_reads_only_its_own_prefixes_and_refused_reads_as_missing(
    served: tuple[Kenning, TestClient], buckets: tuple[str, str]
) -> None:
    memory, client = served
    shared, private = buckets
    acme, umbra = keyed(memory, "acme"), keyed(memory, "umbra")
    missing = f"s3://nothing-{shared}/acme/"

    # When acme adds its own folder, umbra's folder, a bucket no one may read and a missing one
    done = add(client, acme, f"s3://{shared}/acme/", f"s3://{shared}/umbra/", f"s3://{private}", missing)

    # Then only its own folder is added; the refused and the missing say one and the same thing
    assert [item["name"] for item in done["added"]] == ["a.txt"]
    refused = {uri: done["errors"][uri] for uri in (f"s3://{shared}/umbra/", f"s3://{private}", missing)}
    assert set(refused.values()) == {UNREADABLE_BUCKET}
    # And a broader prefix than the one allowed is refused too
    assert add(client, acme, f"s3://{shared}")["errors"] == {f"s3://{shared}": UNREADABLE_BUCKET}
    # And umbra reads its own folder
    assert [item["name"] for item in add(client, umbra, f"s3://{shared}/umbra/")["added"]] == ["u.txt"]


def test_with_no_allow_list_key_callers_read_no_bucket_and_the_operator_reads_all(
    tmp_path: Path, s3_url: str, buckets: tuple[str, str]
) -> None:
    shared, private = buckets
    settings = load_settings(home=tmp_path / "home", embedding_provider="hash", s3_endpoint_url=s3_url)
    with Kenning(settings) as memory, TestClient(create_app(memory)) as client:
        auth = keyed(memory, memory.settings.tenant)
        # A key's caller reads no bucket: existing or not, the same answer
        done = add(client, auth, f"s3://{shared}/acme/", f"s3://nothing-{private}")
        assert not done["added"] and set(done["errors"].values()) == {UNREADABLE_BUCKET}
        # The operator reads what its credentials reach; a missing bucket gives the same answer
        mine = memory.add_paths([f"s3://{private}", f"s3://nothing-{private}"], "docs")
        assert [item.name for item in mine.added] == ["p.txt"]
        assert mine.errors == {f"s3://nothing-{private}": UNREADABLE_BUCKET}


def test_the_allow_list_is_checked_at_startup() -> None:
    ok = load_settings(s3_allow='["s3://b/docs/=acme", "s3://c=umbra"]').s3_allow
    assert [(g.bucket, g.prefix, g.tenant) for g in ok] == [("b", "docs/", "acme"), ("c", "", "umbra")]
    for bad in ("b/docs=acme", "s3://b/docs", "s3:///x=acme", "[broken"):
        with pytest.raises(ConfigError, match="KENNING_S3_ALLOW"):
            load_settings(s3_allow=bad)
