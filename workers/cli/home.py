"""The home a command works in: one that holds a kenning home already, unless the command is one
that makes memory (`add`, `remember`, `demo`, `serve`...). A KENNING_HOME with a typo is said at
once, never made into an empty home that answers every question with nothing."""

from __future__ import annotations

from typing import Any

from kenning.pipeline.errors import ConfigError
from kenning.workers.runtime.settings import Settings, load_settings

METADATA_FILE = "kenning.db"


def settings_for(*, makes_home: bool = False, **overrides: Any) -> Settings:
    """The settings; ConfigError when their home holds no kenning home and the command would not
    make one (its metadata on a server, as in distributed mode, the home needs nothing)."""
    settings = load_settings(**overrides)
    if not makes_home:
        require_home(settings)
    return settings


def require_home(settings: Settings) -> None:
    if settings.metadata_url or (settings.home / METADATA_FILE).is_file():
        return
    raise ConfigError(
        f"no kenning home at {settings.home.resolve()} (KENNING_HOME); "
        "`kenning add` or `kenning remember` makes one"
    )
