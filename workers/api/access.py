"""Who is calling: an API key becomes a `Caller` (tenant, user, grants) and the memory as it sees it.

`authorized` is the dependency every `/v1` route takes; a router mounted on the app later (an
MCP endpoint, a graph view) takes it too and gets the same principal and the same checks.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
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


class AuthThrottle:
    """Failed API keys per client address: after `max_failures` within `window_s` of the first,
    the address is refused (429) until that window has passed. A success changes nothing (a right
    key must not clear the count between guesses); at most `max_addresses` are kept, the oldest
    windows dropped first."""

    def __init__(
        self,
        max_failures: int = 20,
        window_s: float = 60.0,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures, self.window_s, self.max_addresses = max_failures, window_s, max_addresses
        self._clock = clock
        # address -> (start of its window, failures in it), oldest window first
        self._failures: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._failures)

    def retry_after(self, address: str) -> int:
        """Whole seconds until the address may try again; 0 when it may now."""
        with self._lock:
            start, count = self._failures.get(address, (0.0, 0))
            left = start + self.window_s - self._clock()
            return max(1, math.ceil(left)) if count >= self.max_failures and left > 0 else 0

    def failed(self, address: str) -> None:
        with self._lock:
            now = self._clock()
            self._drop_expired(now)
            start, count = self._failures.get(address, (now, 0))
            if start + self.window_s <= now:
                start, count = now, 0
            self._failures[address] = (start, count + 1)
            if count == 0:
                self._failures.move_to_end(address)
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)

    def _drop_expired(self, now: float) -> None:
        """Forget the windows that have passed, oldest first. The caller holds the lock."""
        while self._failures:
            address, (start, _) = next(iter(self._failures.items()))
            if start + self.window_s > now:
                return
            del self._failures[address]


@dataclass
class ApiState:
    """What the app holds for its life: the memory (stores opened once) and the runs it started."""

    memory: Kenning
    runs: RunTracker
    distributed: bool = False
    throttle: AuthThrottle = field(default_factory=AuthThrottle)


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
    """The request's `Access`; 401 without a key, or with an unknown or revoked one (read afresh);
    429 for an address that sent too many unknown keys lately (`AuthThrottle`)."""
    state = api_state(request)
    address = request.client.host if request.client else ""
    wait = state.throttle.retry_after(address)
    if wait:
        message = f"too many unknown API keys from this address; retry in {wait} s"
        raise ApiError(429, "too_many_requests", message, {"Retry-After": str(wait)})
    if credentials is None:
        raise ApiError(401, "unauthorized", "send an API key: Authorization: Bearer <key>", CHALLENGE)
    try:
        return access_of(state, credentials.credentials)
    except ApiError as error:
        if error.status == 401:
            state.throttle.failed(address)
        raise


def access_of(state: ApiState, token: str) -> Access:
    caller = authenticate(state.memory.wiring.permissions, token)
    if caller is None:
        raise ApiError(401, "unauthorized", "the API key is unknown or revoked", CHALLENGE)
    memory = state.memory.as_caller(caller)
    return Access(caller=caller, memory=memory, state=state, token=token)
