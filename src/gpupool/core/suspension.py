"""A lease's suspension: the states, who asked, what was parked, and the claim that brings it back.

A suspended lease keeps its id, holder, queue and priority but holds no GPU memory: its CUDA
processes' memory is parked in their own host memory (isolation/parking.py does that on the
node) and the rest of its tree is stopped. The walk is one way round:

    running --suspend--> suspending --runner parked it--> suspended
    suspended --room again--> resuming --runner restored it--> running

`suspending` and `resuming` are the steps the runner acts on; the pool changes the state in one
transaction each (pool/suspend.py); core/resumption.py places a suspended lease again. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from .errors import InvalidInput

if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional, Tuple


# A lease's states: a lease with no suspension record is running.
RUNNING = "running"
SUSPENDING = "suspending"  # asked to suspend: its runner parks the GPU state
SUSPENDED = "suspended"  # parked: it holds no GPU memory
RESUMING = "resuming"  # given room again: its runner restores the GPU state
LEASE_STATES = (RUNNING, SUSPENDING, SUSPENDED, RESUMING)

# Who suspended a lease.
BY_PREEMPTION = "preemption"
BY_OWNER = "owner"
BY_ADMIN = "admin"
BY_IDLE = "idle"
SUSPENDERS = (BY_PREEMPTION, BY_OWNER, BY_ADMIN, BY_IDLE)

# What a queue's preemption does to a borrowing lease.
PREEMPT_SUSPEND = "suspend"  # park its GPU state, resume it when there is room again
PREEMPT_REQUEUE = "requeue"  # stop the command and queue the same claim again (rerun), as --requeue does
PREEMPT_KILL = "kill"  # stop the command; it reruns only where its run says --requeue, else exits 8
PREEMPT_MODES = (PREEMPT_SUSPEND, PREEMPT_REQUEUE, PREEMPT_KILL)
# How each mode leaves its victim, as `queue list`, the metric's `mode` label's readers and the
# history (`usage --by lease`: preempted/suspended, as sacct says PREEMPTED) name it.
PREEMPTED_AS = {PREEMPT_SUSPEND: "suspended", PREEMPT_REQUEUE: "requeued", PREEMPT_KILL: "killed"}
DEFAULT_PREEMPT_MODE = PREEMPT_SUSPEND

# Errors kept on a lease are one line for a status table, not a log.
MAX_ERROR_CHARS = 500


def check_preempt_mode(mode: str, what: str = "preempt") -> str:
    """`mode` if it is one of PREEMPT_MODES; InvalidInput naming it and the choices otherwise."""
    if mode not in PREEMPT_MODES:
        raise InvalidInput(f"{what} {mode!r} must be one of {', '.join(PREEMPT_MODES)} (e.g. --preempt suspend)")
    return mode


class ParkedSlice(NamedTuple):
    """GPU memory a suspended lease held: on which device, of which model, for which request."""

    device_uuid: str
    memory_mib: int
    group: int
    model: str

    def to_dict(self) -> Dict[str, Any]:
        return {"uuid": self.device_uuid, "memory_mib": self.memory_mib, "group": self.group, "model": self.model}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParkedSlice:
        return cls(str(data["uuid"]), int(data["memory_mib"]), int(data.get("group", 0)), str(data.get("model", "")))


@dataclass(frozen=True)
class Suspension:
    """The suspension record of one lease (its state while it is not simply running)."""

    state: str
    by: str
    reason: str
    since: float  # when the lease entered `state`
    want_resume: bool  # take room again as soon as there is some (a preemption's suspension does)
    parked: Tuple[ParkedSlice, ...] = ()
    remap: Tuple[Tuple[str, str], ...] = ()  # (old GPU UUID, new GPU UUID) of the step `resuming`
    host_bytes: int = 0  # what the node reported parked in host memory
    error: str = ""  # the last suspend or restore that failed, for people
    suspended_s: float = 0.0  # seconds spent suspended before `since` (usage: not GPU time)
    ticket: Optional[int] = None  # its place in the queue while it waits for room
    mode: str = ""  # the preemption mode applied to it ('' = not preempted): suspend, requeue or kill

    def to_dict(self) -> Dict[str, Any]:
        return {
            "state": self.state,
            "by": self.by,
            "reason": self.reason,
            "since": self.since,
            "want_resume": self.want_resume,
            "parked": [p.to_dict() for p in self.parked],
            "remap": dict(self.remap),
            "host_bytes": self.host_bytes,
            "error": self.error,
            "suspended_s": self.suspended_s,
            "ticket": self.ticket,
            "mode": self.mode,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Suspension:
        ticket = data.get("ticket")
        return cls(
            state=str(data["state"]),
            by=str(data.get("by", "")),
            reason=str(data.get("reason", "")),
            since=float(data.get("since", 0.0)),
            want_resume=bool(data.get("want_resume", False)),
            parked=tuple(ParkedSlice.from_dict(p) for p in data.get("parked", ())),
            remap=tuple((str(old), str(new)) for old, new in dict(data.get("remap", {})).items()),
            host_bytes=int(data.get("host_bytes", 0)),
            error=str(data.get("error", "")),
            suspended_s=float(data.get("suspended_s", 0.0)),
            ticket=None if ticket is None else int(ticket),
            mode=str(data.get("mode", "")),
        )

    def suspended_seconds(self, now: float) -> float:
        """Seconds this lease has spent suspended (parked), up to `now`."""
        ongoing = now - self.since if self.state in (SUSPENDED, RESUMING) else 0.0
        return self.suspended_s + max(0.0, ongoing)

    def with_error(self, error: str) -> Suspension:
        return replace(self, error=one_line(error))


def one_line(text: str) -> str:
    """`text` on one line and at most MAX_ERROR_CHARS long (a status cell, a JSON field)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= MAX_ERROR_CHARS else flat[: MAX_ERROR_CHARS - 1] + "…"


__all__ = [
    "RUNNING",
    "SUSPENDING",
    "SUSPENDED",
    "RESUMING",
    "LEASE_STATES",
    "BY_PREEMPTION",
    "BY_OWNER",
    "BY_ADMIN",
    "BY_IDLE",
    "SUSPENDERS",
    "PREEMPT_SUSPEND",
    "PREEMPT_REQUEUE",
    "PREEMPT_KILL",
    "PREEMPT_MODES",
    "DEFAULT_PREEMPT_MODE",
    "ParkedSlice",
    "Suspension",
    "check_preempt_mode",
    "one_line",
    "LEASE_STATES",
]
