"""The HTTP API: FastAPI over `Kenning`, with users, API keys and per-dataset permissions."""

from kenning.workers.api.access import Access, ApiState, authorized
from kenning.workers.api.app import create_app, serve

__all__ = [
    # The app, and running it
    "create_app",
    "serve",
    # For routes mounted on it: the caller and what it may do
    "Access",
    "ApiState",
    "authorized",
]
