"""The README's quick start, run as written: every command of its bash block, in a fresh directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
# Steps that set up the repository's own environment; this test runs in it already.
SETUP = ("make setup", ". .venv/bin/activate")


def quick_start() -> list[str]:
    """The command lines of the first bash block under `## Quick start`."""
    section = README.read_text().split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the quick start has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_quick_start_runs_as_written(tmp_path: Path) -> None:
    # Given a fresh directory, offline embeddings and kenning on the PATH
    bin_dir = Path(sys.executable).parent
    env = {name: value for name, value in os.environ.items() if not name.startswith("KENNING_")}
    env.update(KENNING_EMBEDDING_PROVIDER="hash", PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    lines = quick_start()
    commands = [line for line in lines if not line.startswith(SETUP)]
    assert all(line.startswith("kenning ") for line in commands), commands
    assert len(lines) - len(commands) == len(SETUP)
    # When each command runs, as a shell runs it
    outputs = []
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        # Then each succeeds
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        outputs.append((command, done.stdout))
    # And every search finds something in what the quick start added
    searches = [(command, out) for command, out in outputs if command.startswith("kenning search")]
    assert searches
    for command, out in searches:
        if "--json" in command:
            assert json.loads(out)["results"], command
        else:
            assert re.search(r"^ *1\. \[", out, re.MULTILINE), f"{command}\n{out}"
