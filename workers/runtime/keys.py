"""Every Redis key prefix and Celery queue name kenning uses, derived from one deployment prefix.

Deployments that share a Redis stay apart by giving each its own `KENNING_QUEUE_PREFIX`.
"""

from __future__ import annotations

QUEUE_KINDS = ("pipeline", "extract", "load", "query")
# Tasks that open the graph and vector stores run on the load queue only, so that a
# Qdrant local path is opened by the one process that consumes that queue.
TASK_QUEUES = {
    "kenning.extract": "extract",
    "kenning.load": "load",
    "kenning.load_part": "load",
    "kenning.fk_edges": "load",
    "kenning.forget": "load",
    "kenning.improve": "load",
    "kenning.search": "query",
}


def queue_name(prefix: str, kind: str) -> str:
    """`<prefix>.<kind>`, e.g. `kenning.extract`."""
    return f"{prefix}.{kind}"


def lock_prefix(prefix: str) -> str:
    """Keys of the dataset run locks."""
    return f"{prefix}:lock:"


def write_lock_prefix(prefix: str) -> str:
    """Keys of the locks that let one load write of a dataset at a time through."""
    return f"{prefix}:writes:"


def claims_prefix(prefix: str) -> str:
    """Keys of the chunks each run's load parts have taken (a set per run)."""
    return f"{prefix}:claims:"


def deliveries_prefix(prefix: str) -> str:
    """Keys counting how often each task message was delivered."""
    return f"{prefix}:deliveries:"


def lease_prefix(prefix: str) -> str:
    """Keys of the runs' leases and of the failures recorded while the metadata store was away."""
    return f"{prefix}:lease:"


def ratelimit_prefix(prefix: str) -> str:
    """Keys of the global LLM token buckets."""
    return f"{prefix}:ratelimit:"


def breaker_prefix(prefix: str) -> str:
    """Keys of the LLM endpoints' failures in a row and open breakers, shared by the workers."""
    return f"{prefix}:breaker:"


def forgets_key(prefix: str) -> str:
    """The forget mark: a count every forget adds one to (each process then drops its embedder's cache)."""
    return f"{prefix}:forgets"


def session_prefix(prefix: str) -> str:
    """Keys of the session memory."""
    return f"{prefix}:session:"


def unacked_keys(prefix: str) -> dict[str, str]:
    """The Redis transport's keys for unacknowledged messages, as broker transport options."""
    return {
        "unacked_key": f"{prefix}.unacked",
        "unacked_index_key": f"{prefix}.unacked_index",
        "unacked_mutex_key": f"{prefix}.unacked_mutex",
    }


# The task message header naming the run a task belongs to.
RUN_HEADER = "kenning_run"
