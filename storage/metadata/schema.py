"""The relational metadata tables, shared by the SQL store and its migrations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB


class UtcDateTime(sa.TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC datetimes out, on SQLite (no zone support) as on PostgreSQL."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def json_type() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(JSONB(), "postgresql")


metadata = sa.MetaData()

datasets = sa.Table(
    "datasets",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(255), nullable=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.UniqueConstraint("tenant", "name", name="uq_datasets_tenant_name"),
)

data_items = sa.Table(
    "data_items",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("source", sa.Text(), nullable=False),
    sa.Column("content_hash", sa.String(128), nullable=False),
    sa.Column("size", sa.BigInteger(), nullable=False),
    sa.Column("mime", sa.String(255), nullable=False),
    # The source's own version (an S3 ETag), to skip unchanged objects without reading them.
    sa.Column("version", sa.String(255), nullable=False, server_default=""),
    # The named subsets the item belongs to, carried to every data point built from it.
    sa.Column("node_sets", json_type(), nullable=False, server_default=sa.text("'[]'")),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("error", sa.Text(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    # Content dedup within a dataset: the same bytes in another dataset is a new item.
    sa.UniqueConstraint("dataset_id", "content_hash", name="uq_data_items_dataset_hash"),
    sa.Index("ix_data_items_dataset_status", "dataset_id", "status"),
)

pipeline_runs = sa.Table(
    "pipeline_runs",
    metadata,
    sa.Column("id", sa.String(255), primary_key=True),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("step", sa.String(255), nullable=False),
    sa.Column("error", sa.Text(), nullable=False),
    sa.Column("stats", json_type(), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=False),
    sa.Column("finished_at", UtcDateTime(), nullable=True),
    # Which runner runs it: embedded or distributed ("" for runs recorded before 0007).
    sa.Column("mode", sa.String(32), nullable=False, server_default=""),
    sa.Index("ix_pipeline_runs_dataset", "dataset_id", "started_at"),
)

documents = sa.Table(
    "documents",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("data_id", sa.String(64), nullable=False),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("mime", sa.String(255), nullable=False),
    sa.Index("ix_documents_dataset_data", "dataset_id", "data_id"),
)

chunks = sa.Table(
    "chunks",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("document_id", sa.String(64), nullable=False),
    sa.Column("data_id", sa.String(64), nullable=False),
    # "index" is a reserved word in SQL; the column keeps its meaning under another name.
    sa.Column("chunk_index", sa.Integer(), nullable=False),
    sa.Column("text", sa.Text(), nullable=False),
    sa.Column("token_count", sa.Integer(), nullable=False),
    sa.Column("text_hash", sa.String(128), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("error", sa.Text(), nullable=False),
    sa.Index("ix_chunks_dataset_order", "dataset_id", "document_id", "chunk_index"),
    sa.Index("ix_chunks_dataset_status", "dataset_id", "status"),
)

extractions = sa.Table(
    "extractions",
    metadata,
    sa.Column("key", sa.String(512), primary_key=True),
    sa.Column("value", json_type(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("tenant", sa.String(255), primary_key=True),
    # "user" is a reserved word in PostgreSQL; the column keeps its meaning under another name.
    sa.Column("user_id", sa.String(255), primary_key=True),
    sa.Column("session_id", sa.String(255), primary_key=True),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=False),
    sa.Column("last_activity_at", UtcDateTime(), nullable=False),
    sa.Column("ended_at", UtcDateTime(), nullable=True),
    sa.Column("tokens_in", sa.BigInteger(), nullable=False),
    sa.Column("tokens_out", sa.BigInteger(), nullable=False),
    sa.Column("estimated_cost", sa.Float(), nullable=False),
    sa.Column("errors", sa.Integer(), nullable=False),
    sa.Column("last_error", sa.Text(), nullable=False),
    # Per model: {"tokens_in": n, "tokens_out": n, "cost": x, "calls": n}.
    sa.Column("models", json_type(), nullable=False),
)

# When each retrieved element (a chunk, mostly) was last returned by a search, and how often:
# what time decay and prune read. Written in batches, never once per hit.
element_access = sa.Table(
    "element_access",
    metadata,
    sa.Column("dataset_id", sa.String(64), primary_key=True),
    sa.Column("element_id", sa.String(64), primary_key=True),
    sa.Column("last_access", UtcDateTime(), nullable=False),
    sa.Column("count", sa.BigInteger(), nullable=False),
)

# Who may do what (pipeline/permission.py): tenants, their users, API keys stored as the
# SHA-256 of the token (never the token), and per-dataset grants naming the dataset.
tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("created_at", UtcDateTime(), nullable=False),
)

users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(255), nullable=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("admin", sa.Boolean(), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.UniqueConstraint("tenant", "name", name="uq_users_tenant_name"),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("user_id", sa.String(64), nullable=False),
    sa.Column("key_hash", sa.String(128), nullable=False),
    sa.Column("created_at", UtcDateTime(), nullable=False),
    sa.Column("revoked_at", UtcDateTime(), nullable=True),
    sa.Index("ix_api_keys_user", "user_id"),
)

dataset_grants = sa.Table(
    "dataset_grants",
    metadata,
    sa.Column("user_id", sa.String(64), primary_key=True),
    sa.Column("dataset", sa.String(255), primary_key=True),
    sa.Column("permission", sa.String(16), primary_key=True),
    sa.Column("tenant", sa.String(255), nullable=False),
    sa.Index("ix_dataset_grants_dataset", "tenant", "dataset"),
)

# Every LLM request a run's steps sent (pipeline/spend.py): recorded before it is sent, its
# tokens added once answered, so that a run's spend counts retries and killed tasks' calls.
llm_attempts = sa.Table(
    "llm_attempts",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(255), nullable=False),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
    sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
    sa.Column("sent_at", UtcDateTime(), nullable=False),
    # What it was for: a run's extraction, or a search's completion (0008); attempts before it
    # were all extractions. The agent session it was made in, if any ("" for none).
    sa.Column("kind", sa.String(16), nullable=False, server_default="extraction"),
    sa.Column("tenant", sa.String(255), nullable=False, server_default=""),
    sa.Column("user_id", sa.String(255), nullable=False, server_default=""),
    sa.Column("session_id", sa.String(255), nullable=False, server_default=""),
    sa.Index("ix_llm_attempts_run", "run_id"),
    sa.Index("ix_llm_attempts_dataset", "dataset_id"),
    sa.Index("ix_llm_attempts_session", "tenant", "user_id", "session_id"),
)

# The other datasets an attempt is charged to (0010): a search of several datasets is charged to
# each it read; `llm_attempts.dataset_id` holds the first.
llm_attempt_datasets = sa.Table(
    "llm_attempt_datasets",
    metadata,
    sa.Column("attempt_id", sa.String(64), primary_key=True),
    sa.Column("dataset_id", sa.String(64), primary_key=True),
    sa.Index("ix_llm_attempt_datasets_dataset", "dataset_id"),
)

# The LLM circuit breaker of each endpoint and model (storage/inference/llm_openai.py), as its last
# change left it: so that `status`, in any process, shows whether calls to it are failing fast.
llm_breakers = sa.Table(
    "llm_breakers",
    metadata,
    sa.Column("endpoint", sa.String(512), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("cooldown_s", sa.Float(), nullable=False),
    sa.Column("changed_at", UtcDateTime(), nullable=False),
)

# The structured-output rung each LLM endpoint and model answered on (kenning.pipeline.ladder):
# found once, by the first extraction that worked, for every process that calls it.
llm_output_rungs = sa.Table(
    "llm_output_rungs",
    metadata,
    sa.Column("endpoint", sa.String(512), primary_key=True),
    sa.Column("model", sa.String(255), primary_key=True),
    sa.Column("rung", sa.String(32), nullable=False),
    sa.Column("changed_at", UtcDateTime(), nullable=False),
)
