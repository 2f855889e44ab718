"""`kenning add s3://...` against a moto S3 server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings
from tests.services import free_port


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url, timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("moto_server did not start on 127.0.0.1")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def bucket(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_url)
    name = f"docs-{os.getpid()}-{time.monotonic_ns()}"
    client.create_bucket(Bucket=name)
    return client, name


def memory(tmp_path: Path, s3_url: str) -> Kenning:
    return Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash", s3_endpoint_url=s3_url))


def test_bucket_prefix_is_added_paginated_and_unchanged_objects_are_skipped(
    bucket: Any, s3_url: str, tmp_path: Path
) -> None:
    client, name = bucket
    # Given more objects under the prefix than one listing page holds, and one outside it
    for number in range(1005):
        client.put_object(
            Bucket=name, Key=f"papers/p{number:04}.txt", Body=f"Paper {number} on topic {number % 7}."
        )
    client.put_object(Bucket=name, Key="other/skip.txt", Body=b"Not under the prefix.")
    with memory(tmp_path, s3_url) as kenning:
        # When the prefix is added twice
        first = kenning.add_paths([f"s3://{name}/papers/"], "papers")
        second = kenning.add_paths([f"s3://{name}/papers/"], "papers")
        # And one object changes
        client.put_object(Bucket=name, Key="papers/p0001.txt", Body=b"Paper 1, revised.")
        third = kenning.add_paths([f"s3://{name}/papers/"], "papers")
        items = kenning.wiring.metadata.list_items(
            kenning.wiring.metadata.ensure_dataset(kenning.scope("papers")).id
        )
    # Then every object is added once, unchanged ones are not read again, the change is added
    assert len(first.added) == 1005 and not first.errors
    assert not second.added and len(second.skipped) == 1005
    assert [item.name for item in third.added] == ["p0001.txt"] and len(third.skipped) == 1004
    assert all(item.source.startswith(f"s3://{name}/papers/") and item.version for item in items)


def test_objects_over_the_size_limit_are_recorded_and_the_rest_proceed(
    bucket: Any, s3_url: str, tmp_path: Path
) -> None:
    client, name = bucket
    client.put_object(Bucket=name, Key="big.txt", Body=b"x" * 5000)
    client.put_object(Bucket=name, Key="small.txt", Body=b"Small and fine.")
    settings = load_settings(
        home=tmp_path / "home", embedding_provider="hash", s3_endpoint_url=s3_url, max_document_bytes=1000
    )
    with Kenning(settings) as kenning:
        result = kenning.add_paths([f"s3://{name}"])
        run = kenning.cognify()
    assert [item.name for item in result.added] == ["small.txt"]
    assert "over the limit" in result.errors[f"s3://{name}/big.txt"]
    assert run.status.value == "completed"


def test_aws_endpoint_url_from_the_environment_is_honoured(
    bucket: Any, s3_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, name = bucket
    client.put_object(Bucket=name, Key="a.json", Body=json.dumps([{"id": 1, "name": "Ada"}]).encode())
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_url)
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as kenning:
        result = kenning.add_paths([f"s3://{name}/"])
    assert [item.name for item in result.added] == ["a.json"]
