"""The real-model tier: runs only when KENNING_REAL_LLM_URL names an OpenAI-compatible /v1 URL.

`make test-llm` builds and starts the local server of scripts/real_llm.sh and sets it; `make test`
and CI leave it unset, so these tests skip there, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kenning.pipeline.models import PipelineRun
from kenning.workers.memory import Kenning
from kenning.workers.runtime.settings import Settings, load_settings
from tests.real_llm.server import real_llm_overrides, script_server_url

SAMPLES = Path(__file__).resolve().parents[2] / "workers" / "samples"


@pytest.fixture(scope="session")
def llm_url() -> str:
    url = os.environ.get("KENNING_REAL_LLM_URL")
    if url:
        return url
    running = script_server_url()
    hint = f"the server of scripts/real_llm.sh is up at {running}: " if running else ""
    pytest.skip(f"no real LLM: {hint}run `make test-llm` or set KENNING_REAL_LLM_URL to a /v1 URL")


@pytest.fixture(scope="session")
def llm_env(llm_url: str) -> dict[str, str]:
    """The process environment for a kenning command: no KENNING_* but the real server's settings."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("KENNING_")}
    env.update({f"KENNING_{k.upper()}": str(v) for k, v in real_llm_overrides(llm_url).items()})
    return env


def real_settings(home: Path, url: str) -> Settings:
    """Defaults but the home and the real server's settings."""
    return load_settings(home=home, **real_llm_overrides(url))


@dataclass
class Cognified:
    memory: Kenning
    run: PipelineRun


@pytest.fixture(scope="module")
def samples(llm_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cognified]:
    """The bundled samples, added and cognified once with the real model, for a module's tests."""
    with Kenning(real_settings(tmp_path_factory.mktemp("home"), llm_url)) as memory:
        memory.add_paths([str(SAMPLES)], "samples")
        yield Cognified(memory, memory.cognify("samples"))
