"""Where the real local model answers: KENNING_REAL_LLM_URL, or the server of scripts/real_llm.sh."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The alias scripts/real_llm.sh gives the model; any name is answered by that one-model server.
MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"


def llm_dir() -> Path:
    return Path(os.environ.get("KENNING_LLM_DIR") or ROOT / ".kenning" / "llm")


def script_server_url() -> str | None:
    """The /v1 URL of the server scripts/real_llm.sh started, when it is up and answers."""
    url_file = llm_dir() / "server.url"
    if not url_file.is_file():
        return None
    url = url_file.read_text().strip() + "/v1"
    return url if answers(url) else None


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/models", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def real_llm_url() -> str | None:
    """KENNING_REAL_LLM_URL when it is set (an OpenAI-compatible /v1 URL), else the script's server."""
    return os.environ.get("KENNING_REAL_LLM_URL") or script_server_url()


def real_llm_model() -> str:
    return os.environ.get("KENNING_REAL_LLM_MODEL") or MODEL


def real_llm_overrides(url: str) -> dict[str, object]:
    """Settings for the real server: the defaults but its endpoint and model. kenning paces a
    server that answers one request at a time by itself (streamed answers, calls in flight
    learnt from the server: docs/real-llm.md)."""
    return {"llm_url": url, "llm_model": real_llm_model()}
