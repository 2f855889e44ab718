"""Alembic environment of the metadata tables; run it through `kenning.storage.metadata.sql.migrate`."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from kenning.storage.metadata.schema import metadata

# A version table of our own, so another migration history in the same database cannot collide.
VERSION_TABLE = "metadata_alembic_version"


def include_name(name: str | None, type_: str, _parent: object) -> bool:
    """Autogenerate compares only the tables this schema owns, never other adapters' tables."""
    return type_ != "table" or name in metadata.tables


def run_migrations() -> None:
    if context.is_offline_mode():
        raise RuntimeError("the metadata migrations run online only, through storage.metadata.sql.migrate")
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, sa.Connection):
        raise RuntimeError("no connection given: call storage.metadata.sql.migrate(engine)")
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
