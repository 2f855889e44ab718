"""kenning is one import package: no top-level folder leaks, no import cycles, extras named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import kenning
from kenning.pipeline.errors import ConfigError
from kenning.workers.runtime.extras import needs_extra

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("pipeline", "storage", "retrieval", "workers")


def test_every_folder_is_a_subpackage_of_kenning() -> None:
    for folder in FOLDERS:
        link = ROOT / "kenning" / folder
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve()


def test_a_bare_folder_name_is_not_importable_outside_the_checkout(tmp_path: Path) -> None:
    # Given a process started outside the checkout, with kenning installed
    probe = f"import importlib.util as u; print([n for n in {FOLDERS!r} if u.find_spec(n)])"
    # When it looks for the folders as top-level modules
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    # Then none is there: only `kenning.<folder>` exists
    assert found.stdout.strip() == "[]"


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_bare_folder_name_fails_inside_the_checkout_naming_kenning(folder: str) -> None:
    # Given a process started at the checkout's root, where the folder is on the path
    probe = f"import {folder}.{'models' if folder == 'pipeline' else 'nothing'}"
    # When it imports the folder by its bare name
    tried = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    # Then the import fails, naming the one path there is
    assert tried.returncode != 0
    assert f"import kenning.{folder}, not {folder}" in tried.stderr


def test_a_bare_import_is_a_lint_failure(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from pipeline.models import Chunk\nimport workers.cli.main\n")
    ruff = Path(sys.executable).parent / "ruff"
    checked = subprocess.run(
        [str(ruff), "check", "--config", str(ROOT / "pyproject.toml"), str(bad)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode != 0
    assert checked.stdout.count("TID251") == 2


def test_the_package_has_no_import_cycles() -> None:
    graph = grimp.build_graph("kenning")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            if chain and imported.startswith("kenning."):
                cycles.append(" -> ".join([module, *chain]))
    assert cycles == []


def test_version_is_the_distribution_version() -> None:
    from importlib.metadata import version

    assert kenning.__version__ == version("kenning")
    assert (ROOT / "kenning" / "py.typed").exists()


def test_a_missing_extra_is_named() -> None:
    named = pytest.raises(ConfigError, match=r"pip install 'kenning\[server\]'")
    with named, needs_extra("the falkordb backend"):
        raise ModuleNotFoundError("No module named 'falkordb'", name="falkordb")


def test_other_missing_modules_are_not_hidden() -> None:
    with pytest.raises(ModuleNotFoundError), needs_extra("anything"):
        raise ModuleNotFoundError("No module named 'nothing_like_it'", name="nothing_like_it")
