"""The load parts' claims on a run's chunks, in Redis, as the workers keep them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kenning.workers.celery.app import Resources
from kenning.workers.runtime.settings import load_settings
from tests.integration.cluster import forget_keys
from tests.services import free_port

pytestmark = [pytest.mark.redis]


@pytest.fixture
def resources(tmp_path: Path, redis_url: str) -> Iterator[Resources]:
    prefix = f"kenning-test-{uuid.uuid4().hex[:8]}"
    opened = Resources(
        load_settings(home=str(tmp_path), redis_url=redis_url, broker_url=redis_url, queue_prefix=prefix)
    )
    try:
        yield opened
    finally:
        opened.close()
        forget_keys(redis_url, prefix)


def test_each_chunk_is_taken_by_one_part_at_most_limit_at_a_time_until_the_run_ends(
    resources: Resources,
) -> None:
    # Given the claims of a run, and of another run
    claim, other = resources.claiming("run-1"), resources.claiming("run-2")
    # When parts take chunks
    assert claim(["a", "b", "c"], 2) == ["a", "b"]
    # Then a chunk taken is not given again; the limit counts only those newly taken
    assert claim(["a", "b", "c", "d"], 1) == ["c"]
    assert claim(["a", "d", "e"]) == ["d", "e"]
    assert claim([]) == []
    # And another run's claims are its own
    assert other(["a"]) == ["a"]
    # And once the run's claims are forgotten (its end), nothing of them is left
    resources.forget_claims("run-1")
    assert claim(["a"]) == ["a"]


def test_while_redis_is_away_a_part_takes_no_chunk(tmp_path: Path) -> None:
    away = f"redis://127.0.0.1:{free_port()}/0"
    resources = Resources(load_settings(home=str(tmp_path), redis_url=away, broker_url=away))
    try:
        assert resources.claiming("run-1")(["a", "b"]) == []
    finally:
        resources.close()
