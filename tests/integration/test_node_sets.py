"""Node sets through the CLI: `add --node-set`, then CODING_RULES finds that set alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kenning.workers.cli.main import main


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    return tmp_path


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_add_with_a_node_set_then_search_the_coding_rules(env: Path) -> None:
    # Given a rules file added into two node sets and a note added into none
    rules, notes = env / "rules", env / "notes"
    rules.mkdir()
    notes.mkdir()
    (rules / "typing.md").write_text("Always annotate public functions with type hints.")
    (notes / "lunch.txt").write_text("Always annotate public functions? We talked about type hints at lunch.")
    invoke("add", str(rules), "--dataset", "code", "--node-set", "coding_agent_rules", "--node-set", "team")
    invoke("add", str(notes), "--dataset", "code")
    invoke("cognify", "--dataset", "code")
    # When the coding rules are searched
    found = invoke(
        "search", "type hints", "--type", "CODING_RULES", "--dataset", "code", "--only-context", "--json"
    )
    # Then the rule comes back, and the note does not
    payload = json.loads(found.output)
    rule = "Always annotate public functions with type hints."
    assert [hit["text"] for hit in payload["results"]] == [rule]
    assert payload["context"] == f"- {rule}"
