"""What every operation runs with: the ports (the wiring), the settings, and the caller it acts for."""

from __future__ import annotations

from dataclasses import dataclass

from kenning.pipeline.errors import ConfigError
from kenning.pipeline.models import Scope
from kenning.pipeline.names import check_name
from kenning.pipeline.permission import Caller
from kenning.pipeline.session import SessionKey, SessionStore, check_session_id
from kenning.workers.runtime.settings import Settings
from kenning.workers.runtime.wiring import Wiring


@dataclass(frozen=True)
class Context:
    """One caller's view of one deployment; the application modules take it as their first argument."""

    wiring: Wiring
    settings: Settings
    caller: Caller

    def scope(self, dataset: str | None = None) -> Scope:
        """The caller's tenant and the dataset named (default: KENNING_DATASET); an InputError for a
        name that is not valid (`kenning.pipeline.names`)."""
        return Scope(
            tenant=self.caller.tenant, dataset=check_name("dataset", dataset or self.settings.dataset)
        )

    def sessions(self) -> SessionStore:
        store = self.wiring.sessions
        if store is None:
            raise ConfigError(
                "session memory is off (KENNING_SESSION_BACKEND=none): call without a session id"
            )
        return store

    def session_key(self, session_id: str) -> SessionKey:
        """The caller's session of that id; an InputError for an id that breaks the rule every
        surface declares (`kenning.pipeline.session.SESSION_ID_RULE`)."""
        checked = check_session_id(session_id)
        return SessionKey(tenant=self.caller.tenant, user=self.caller.user, session_id=checked)
