"""The tasks other services send by name act for the tenant the request names, through one caller."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.cluster import ROOT

pytestmark = [pytest.mark.redis]

SERVICE = textwrap.dedent(
    """
    import json, sys
    from kenning.workers.celery.app import app
    from kenning.workers.runtime.settings import load_settings
    from kenning.workers.services import tasks

    home, redis_url, prefix = sys.argv[1:4]
    settings = load_settings(
        home=home, embedding_provider="hash", tenant="acme", redis_url=redis_url,
        broker_url=redis_url, queue_prefix=prefix, read_scopes=["*"],
    )
    app.use_settings(settings)
    text = {"name": "a.txt", "text": "Globex keeps its ledgers in Oslo."}
    added = tasks.add_task({"dataset": "books", "tenant": "globex", "texts": [text]})
    metadata = app.resources().wiring.metadata
    tenants = sorted(d.tenant for t in ("acme", "globex") for d in metadata.list_datasets(t))
    forgotten = tasks.forget_task({"dataset": "books", "tenant": "globex"})
    left = [d.name for d in metadata.list_datasets("globex")]
    found = {"added": added["added"], "tenants": tenants, "forgot": forgotten["items"], "left": left}
    print(json.dumps(found))
    app.close_resources()
    """
)


def test_add_and_forget_by_task_name_act_for_the_tenant_the_request_names(
    tmp_path: Path, redis_url: str, key_prefix: str
) -> None:
    # Given a worker of tenant acme, and a service that adds a text for tenant globex
    script = tmp_path / "service.py"
    script.write_text(SERVICE)
    # When it adds and then forgets globex's dataset by task name
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "home"), redis_url, key_prefix],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # Then the dataset was globex's, and the forget found it there and removed it
    assert found["added"] == 1 and found["tenants"] == ["globex"]
    assert len(found["forgot"]) == 1 and found["left"] == []
