"""Memory records as CRUD: create, list by page, get with what it produced, update, delete."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kenning.pipeline.errors import InputError
from kenning.workers.cli.main import main
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import load_settings


def test_records_round_trip_and_update_replaces_stale_facts(tmp_path: Path) -> None:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        records = memory.records
        # Given three records
        ceo = records.create("Oliver Reed is the CEO of Falcon Dynamics.", "crm", external_id="ceo")
        for n in range(2):
            records.create(f"Falcon Dynamics opened office number {n} in Boston.", "crm")

        # Then they list by page, and one record shows the nodes and edges it produced
        page = records.list("crm", offset=1, limit=1)
        assert (page.total, len(page.records)) == (3, 1)
        got = records.get(ceo.id, "crm")
        assert got.status == "done" and got.node_ids and got.edge_ids

        # When the record is updated
        updated = records.update(ceo.id, "Nora Blake is the CEO of Falcon Dynamics.", "crm")

        # Then the new text is memory, the old one is gone, and shared facts stay
        assert records.list("crm").total == 3
        texts = " ".join(hit.text for hit in memory.search("CEO Falcon", "CHUNKS", datasets=["crm"]).results)
        assert "Nora Blake" in texts and "Oliver" not in texts and "Boston" in texts
        # And the record kept its id: its data item and content hash are the new version's
        assert (
            updated.id == ceo.id
            and records.get(ceo.id, "crm").text == "Nora Blake is the CEO of Falcon Dynamics."
        )
        assert updated.data_id != ceo.data_id
        assert (
            updated.content_hash == hashlib.sha256(b"Nora Blake is the CEO of Falcon Dynamics.").hexdigest()
        )

        # And delete forgets it
        records.delete(updated.id, "crm")
        assert records.list("crm").total == 2
        with pytest.raises(InputError):
            records.list("crm", limit=0)


def test_memory_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    note = tmp_path / "note.txt"
    note.write_text("Ada Lovelace wrote the first program.")
    runner = CliRunner()
    assert runner.invoke(main, ["remember", str(note), "--dataset", "notes"]).exit_code == 0
    listed = json.loads(runner.invoke(main, ["memory", "list", "--dataset", "notes", "--json"]).output)
    record_id = listed["records"][0]["id"]
    got = json.loads(runner.invoke(main, ["memory", "get", record_id, "--dataset", "notes", "--json"]).output)
    assert got["node_ids"]
    note.write_text("Grace Hopper wrote the first compiler.")
    updated = runner.invoke(main, ["memory", "update", record_id, str(note), "--dataset", "notes", "--json"])
    assert json.loads(updated.output)["id"] == record_id
    assert runner.invoke(main, ["memory", "delete", record_id, "--dataset", "notes"]).exit_code == 0
    assert (
        json.loads(runner.invoke(main, ["memory", "list", "--dataset", "notes", "--json"]).output)["total"]
        == 0
    )


def test_memory_get_shows_the_record_s_text_and_what_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KENNING_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KENNING_EMBEDDING_PROVIDER", "hash")
    with Kenning(load_settings()) as memory:
        made = memory.records.create("Ada Lovelace worked with Charles Babbage in London.", "notes")
    shown = CliRunner().invoke(main, ["memory", "get", made.id, "--dataset", "notes"])
    assert shown.exit_code == 0
    # The text itself, the entities by name and the relations between them, not ids alone
    assert "Ada Lovelace worked with Charles Babbage in London." in shown.output
    assert "Charles Babbage" in shown.output.split("Ada Lovelace worked")[1]
    assert any(" -" in line and "-> " in line for line in shown.output.splitlines())
    assert made.data_id in shown.output


def test_a_record_is_found_by_its_data_id_and_keeps_its_id_over_updates(tmp_path: Path) -> None:
    with Kenning(load_settings(home=tmp_path / "home", embedding_provider="hash")) as memory:
        records = memory.records
        made = records.create("The lighthouse keeper is Ann.", "crm")
        assert records.get(made.data_id, "crm").id == made.id
        for text in ("The lighthouse keeper is Bea.", "The lighthouse keeper is Cy."):
            assert records.update(made.id, text, "crm").id == made.id
        page = records.list("crm")
        assert [(r.id, r.text) for r in page.records] == [(made.id, None)] and page.total == 1
        assert records.get(made.id, "crm").text == "The lighthouse keeper is Cy."
