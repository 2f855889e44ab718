"""kenning: long-term memory for AI agents, a knowledge graph plus a vector index."""

# The Python API
# Errors
from pipeline.errors import ConfigError, InputError, KenningError, NoLLMConfigured, StoreError

# Search
from retrieval.contract import SearchResult, SearchType
from workers.memory import Kenning
from workers.settings import Settings, load_settings

__all__ = [
    # The Python API
    "Kenning",
    "Settings",
    "load_settings",
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
