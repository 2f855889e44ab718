"""`python -m kenning.workers.cli`: the `kenning` command."""

from kenning.workers.cli.main import run

run()
