"""Errors of the kenning domain: a shallow tree, intent expressed by type."""


class KenningError(Exception):
    """Base of every error kenning raises on purpose."""


class ConfigError(KenningError):
    """The settings are invalid: raised at startup, never at the first request."""


class InputError(KenningError):
    """A data item cannot be processed: recorded against that item, the rest proceeds."""


class StoreError(KenningError):
    """A store failed; driver errors are translated into this at the adapter boundary."""


class TransientStoreError(StoreError):
    """A store failed in a way that a retry may fix (connection lost, timeout)."""


class NoWorker(StoreError):
    """No worker consumes a queue the work needs: sent anyway, it would wait there unseen."""


class DimensionMismatch(StoreError):
    """A vector collection exists with another dimension than the embedder's."""


class LLMError(KenningError):
    """The LLM call failed after its retries, or answered something unusable."""


class TransientLLMError(LLMError):
    """The LLM call failed in a way that a later retry may fix (429, 5xx, timeout)."""


class LLMUnreachable(TransientLLMError):
    """The LLM endpoint failed to connect or answer too many times in a row: its circuit breaker
    is open, and calls fail at once until its cooldown ends. Its text holds `BREAKER_OPEN`."""


BREAKER_OPEN = "circuit breaker open"


class NoLLMConfigured(KenningError):
    """A completion was asked for but no LLM endpoint is configured."""


class LockLost(KenningError):
    """The dataset lock was lost or taken by another run: the holder must abort."""


class QueryBudgetExceeded(StoreError):
    """The graph server stopped a caller's query that ran past its time or memory budget."""


class NotFound(KenningError):
    """No such object, or one the caller may not see: both get the same answer."""


class Forbidden(KenningError):
    """The caller may see the object but lacks the permission the action needs."""


class Conflict(KenningError):
    """The object exists already (a user of that name in the tenant)."""
