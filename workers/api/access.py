"""Who is calling: an API key becomes a `Caller` (tenant, user, grants) and the memory as it sees it.

`authorized` is the dependency every `/v1` route takes; a router mounted on the app later (an
MCP endpoint, a graph view) takes it too and gets the same principal and the same checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kenning.pipeline.errors import NotFound
from kenning.pipeline.models import Dataset, Scope
from kenning.pipeline.permission import Caller, Permission, authenticate
from kenning.workers.api.errors import ApiError
from kenning.workers.api.runs import RunTracker
from kenning.workers.application.gate import readable_datasets
from kenning.workers.memory import Kenning

bearer = HTTPBearer(auto_error=False, description="An API key from `kenning key create`")
CHALLENGE = {"WWW-Authenticate": "Bearer"}


@dataclass
class ApiState:
    """What the app holds for its life: the memory (stores opened once) and the runs it started."""

    memory: Kenning
    runs: RunTracker
    distributed: bool = False


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.kenning
    return state


@dataclass(frozen=True)
class Access:
    """One request's caller, and the memory as that caller: its tenant, user and read scopes."""

    caller: Caller
    memory: Kenning
    state: ApiState
    token: str = field(repr=False)

    def refreshed(self) -> Access:
        """The same key's access read afresh (for a long answer, such as an event stream): 401 once
        the key is revoked, and the grants as they are now."""
        return access_of(self.state, self.token)

    @property
    def tenant(self) -> str:
        return self.caller.tenant

    def dataset_name(self, name: str | None) -> str:
        return name or self.memory.settings.dataset

    def require(self, permission: Permission, name: str | None) -> str:
        """The dataset's name, if the caller holds `permission` on it (see `Caller.check`)."""
        dataset = self.dataset_name(name)
        self.caller.check(permission, dataset)
        return dataset

    def existing(self, permission: Permission, name: str | None) -> Dataset:
        """The dataset, which must exist and allow `permission`; NotFound for one it may not read."""
        dataset = self.require(permission, name)
        found = self.memory.wiring.metadata.get_dataset(Scope(tenant=self.tenant, dataset=dataset))
        if found is None:
            raise NotFound(f"no dataset {dataset!r}")
        return found

    def readable(self, names: Sequence[str] | None) -> list[str]:
        """Those of `names` (all, when None) that exist and the caller may read; others are left
        out silently."""
        return readable_datasets(self.caller, self.memory.wiring.metadata, names)

    def dataset_by_id(self, dataset_id: str, *allowed: Permission) -> Dataset:
        """The tenant's dataset of that id on which the caller holds one of `allowed`; else NotFound."""
        for dataset in self.memory.wiring.metadata.list_datasets(self.tenant):
            if dataset.id == dataset_id and any(self.caller.may(p, dataset.name) for p in allowed):
                return dataset
        raise NotFound("not found")


def authorized(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]
) -> Access:
    """The request's `Access`; 401 without a key, or with an unknown or revoked one (read afresh)."""
    if credentials is None:
        raise ApiError(401, "unauthorized", "send an API key: Authorization: Bearer <key>", CHALLENGE)
    return access_of(api_state(request), credentials.credentials)


def access_of(state: ApiState, token: str) -> Access:
    caller = authenticate(state.memory.wiring.permissions, token)
    if caller is None:
        raise ApiError(401, "unauthorized", "the API key is unknown or revoked", CHALLENGE)
    memory = state.memory.as_caller(caller)
    return Access(caller=caller, memory=memory, state=state, token=token)
