"""Leases: who is working on a run right now, and when a run nobody works on is dead.

Every task of a distributed run holds a lease on its unit of work (`begin`, a step, one batch
of a fan-out) while it runs, renewed by a heartbeat every third of the lease, and left to
expire after it ends: the lease covers the hand-over to the run's next message too. A run
is alive while one of its leases is, or while one of its messages waits in the broker for a
worker; once every lease has expired and no message waits (workers killed, broker state lost,
a batch that nobody will ever acknowledge), no task is working on it and none is coming, and a
supervisor interrupts it and resumes its work in a new run. Chunk and item
statuses, in the metadata store, say which work is left; the lease only says whether anyone
still works on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class LeaseState:
    """A run's leases as the lease store saw them at `now_ms` (its clock): unit -> expiry, in ms."""

    now_ms: int
    leases: dict[str, int] = field(default_factory=dict)
    failure: str = ""

    @property
    def known(self) -> bool:
        """Whether the store has any lease of the run, live or expired."""
        return bool(self.leases)

    @property
    def live(self) -> list[str]:
        return sorted(unit for unit, expiry in self.leases.items() if expiry > self.now_ms)

    @property
    def expired(self) -> list[str]:
        return sorted(unit for unit, expiry in self.leases.items() if expiry <= self.now_ms)

    @property
    def dead(self) -> bool:
        """Known and no lease live: nobody works on the run, and no message of it is due."""
        return self.known and not self.live

    def expired_for_s(self) -> float:
        """How long ago the last lease expired (0 while one is live or none is known)."""
        if not self.dead:
            return 0.0
        return (self.now_ms - max(self.leases.values())) / 1000


class Leases(Protocol):
    """Where the leases of runs live (Redis, next to the broker and the dataset lock)."""

    def renew(self, run_id: str, unit: str, lease_s: float) -> None:
        """Hold (or keep holding) the run's lease on `unit` for `lease_s` from now."""
        ...

    def state(self, run_id: str) -> LeaseState: ...

    def grant_grace(self, run_id: str, lease_s: float) -> bool:
        """When the store knows no lease of the run (it lost its data, or the run never began),
        give it one of `lease_s` so that its tasks have that long to show up. True if given."""
        ...

    def note_failure(self, run_id: str, error: str) -> None:
        """Keep the error that ended the run when the metadata store could not take it."""
        ...

    def claim(self, run_id: str, ttl_s: float) -> bool:
        """One supervisor at a time acts on a run: True for the one that got it."""
        ...

    def forget(self, run_id: str) -> None:
        """The run has ended: drop its leases and recorded failure."""
        ...


def stall_reason(state: LeaseState) -> str:
    """Why a run that is not ended makes no progress, or "" while some task holds a lease of it."""
    if not state.known:
        return "no lease held: no task of the run has been seen working on it"
    if state.live:
        return ""
    units = ", ".join(state.expired[:5]) + (" ..." if len(state.expired) > 5 else "")
    reason = f"leases expired {state.expired_for_s():.0f} s ago ({units}): its workers or messages are lost"
    return f"{reason}; it failed with {state.failure}" if state.failure else reason
