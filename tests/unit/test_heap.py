"""A process that runs a while leaves what it holds after start-up out of full collections."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# Run in a process of its own: freezing this test process's heap would outlive the test.
SETTLE = """
import gc, json
from kenning import settle
before = gc.get_freeze_count()
first, again = settle(), settle()
print(json.dumps([before, gc.get_freeze_count(), first, again]))
"""

COGNIFY = """
import gc, json, sys
from pathlib import Path
from kenning import Kenning, load_settings
from kenning.pipeline.ingest import Source
settings = load_settings(home=Path(sys.argv[1]), embedding_provider="hash")
with Kenning(settings) as memory:
    text = b"Ada Lovelace worked with Charles Babbage in London."
    memory.add([Source(name="note.txt", uri="note.txt", data=text)])
    before = gc.get_freeze_count()
    run = memory.cognify()
    print(json.dumps([before, gc.get_freeze_count(), run.status.value]))
"""


def run_python(script: str, *args: str) -> list[object]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: list[object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_settle_freezes_what_the_process_holds_once() -> None:
    before, after, first, again = run_python(SETTLE)

    assert before == 0 and isinstance(after, int) and after > 10_000
    assert (first, again) == (True, False)


def test_a_cognify_settles_its_process_first(tmp_path: Path) -> None:
    before, after, status = run_python(COGNIFY, str(tmp_path / "home"))

    assert before == 0 and isinstance(after, int) and after > 10_000
    assert status == "completed"
