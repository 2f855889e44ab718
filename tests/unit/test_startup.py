"""A cold start pays only for what it uses: heavy modules load on first use, migrations only when due."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from kenning.storage.metadata.sql import MIGRATIONS, VERSION_TABLE, migrate, newest_revision, stored_revision
from kenning.storage.sql.engine import open_engine
from tests.services import ROOT

# Modules a `kenning search` on an embedded home never needs.
NOT_AT_STARTUP = ("openai", "alembic", "pypdf", "docx", "markdown_it", "celery", "qdrant_client")


def alembic_config(connection: sa.Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def test_the_command_line_imports_no_heavy_module_it_may_not_need() -> None:
    script = (
        "import sys\n"
        "import kenning.workers.cli.main\n"
        f"print(','.join(name for name in {NOT_AT_STARTUP!r} if name in sys.modules))\n"
    )
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_the_newest_revision_is_alembics_head() -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))

    assert newest_revision() == ScriptDirectory.from_config(config).get_current_head()


def test_a_database_one_revision_behind_is_upgraded(tmp_path: Path) -> None:
    # Given a database migrated to the newest revision, then taken one revision back
    engine = open_engine(f"sqlite:///{tmp_path / 'behind.db'}")
    try:
        migrate(engine)
        newest = stored_revision(engine)
        with engine.begin() as connection:
            command.downgrade(alembic_config(connection), "-1")
        assert stored_revision(engine) not in (None, newest)

        # When it is migrated again
        migrate(engine)

        # Then it is at the newest revision, with every table of it
        assert stored_revision(engine) == newest == newest_revision()
        with engine.connect() as conn:
            assert conn.scalars(sa.select(sa.text("version_num")).select_from(sa.text(VERSION_TABLE))).all()
    finally:
        engine.dispose()


def test_a_database_at_the_newest_revision_is_opened_without_alembic(tmp_path: Path) -> None:
    # Given a migrated database
    url = f"sqlite:///{tmp_path / 'current.db'}"
    engine = open_engine(url)
    migrate(engine)
    engine.dispose()
    script = (
        "import sys\n"
        "from kenning.storage.metadata.sql import migrate\n"
        "from kenning.storage.sql.engine import open_engine\n"
        "migrate(open_engine(sys.argv[1]))\n"
        "print('alembic' in sys.modules)\n"
    )

    # When another process migrates it at startup
    done = subprocess.run(
        [sys.executable, "-c", script, url], cwd=ROOT, capture_output=True, text=True, timeout=120
    )

    # Then it reads the revision and goes on, without loading alembic
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_inflect_loads_without_rebuilding_its_functions_and_typeguard_is_left_as_found() -> None:
    script = (
        "import typeguard\n"
        "checked = typeguard.typechecked\n"
        "from kenning.pipeline.text import inflector\n"
        "engine = inflector()\n"
        "import inflect\n"
        "print(engine.singular_noun('films'), engine.plural('city'), typeguard.typechecked is checked,\n"
        "      'typeguard' not in inflect.engine.singular_noun.__code__.co_names)\n"
    )
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["film", "cities", "True", "True"]
