"""kenning: long-term memory for AI agents, a knowledge graph plus a vector index.

Every part of kenning lives under this one package: `kenning.pipeline` (the domain and
the ECL steps), `kenning.storage` (adapters), `kenning.retrieval` (search types) and
`kenning.workers` (wiring, Celery, CLI). The names below load on first use, so that
importing a submodule does not pull in the whole stack.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kenning.pipeline.errors import ConfigError, InputError, KenningError, NoLLMConfigured, StoreError
    from kenning.retrieval.contract import SearchResult, SearchType
    from kenning.workers.memory import Kenning
    from kenning.workers.runtime.heap import settle
    from kenning.workers.runtime.settings import Settings, load_settings

try:
    __version__ = version("kenning")
except PackageNotFoundError:  # a source checkout that was never installed
    __version__ = "0+unknown"

_EXPORTS = {
    # The Python API
    "Kenning": "kenning.workers.memory",
    "Settings": "kenning.workers.runtime.settings",
    "load_settings": "kenning.workers.runtime.settings",
    "settle": "kenning.workers.runtime.heap",
    # Search
    "SearchResult": "kenning.retrieval.contract",
    "SearchType": "kenning.retrieval.contract",
    # Errors
    "ConfigError": "kenning.pipeline.errors",
    "InputError": "kenning.pipeline.errors",
    "KenningError": "kenning.pipeline.errors",
    "NoLLMConfigured": "kenning.pipeline.errors",
    "StoreError": "kenning.pipeline.errors",
}

__all__ = [
    "__version__",
    # The Python API
    "Kenning",
    "Settings",
    "load_settings",
    "settle",
    # Search
    "SearchResult",
    "SearchType",
    # Errors
    "ConfigError",
    "InputError",
    "KenningError",
    "NoLLMConfigured",
    "StoreError",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kenning' has no attribute {name!r}")
