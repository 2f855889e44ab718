"""What a worker has ready when it says it is ready."""

from __future__ import annotations

from pathlib import Path

from kenning.pipeline import collection
from kenning.storage.vectors.holder import META_FILE
from tests.integration.cluster import Deployment, running


def test_a_load_worker_makes_the_vector_collections_before_it_is_ready(
    deployment: Deployment, tmp_path: Path
) -> None:
    # Given a deployment whose vectors are Qdrant Edge under its home, and nothing loaded yet
    folder = deployment.settings.vector_path
    assert not any((folder / name / META_FILE).exists() for name in collection.LOADED)

    # When a worker that consumes the load queue has started
    with running(deployment, tmp_path, {"load": "load"}):
        made = [name for name in collection.LOADED if (folder / name / META_FILE).exists()]

    # Then every collection a load writes is there: the run's first load does not make them
    assert made == list(collection.LOADED)
