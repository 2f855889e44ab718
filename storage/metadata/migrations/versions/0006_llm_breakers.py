"""LLM breakers: the circuit breaker of each endpoint as its last change left it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from kenning.storage.metadata.schema import metadata

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# Like 0001, the table comes straight from the schema module; a later change to it must
# freeze this revision (copy the table definition in) and add a revision of `op.*` steps.
TABLES = ("llm_breakers",)


def upgrade() -> None:
    metadata.create_all(op.get_bind(), tables=[metadata.tables[name] for name in TABLES])


def downgrade() -> None:
    metadata.drop_all(op.get_bind(), tables=[metadata.tables[name] for name in TABLES])
