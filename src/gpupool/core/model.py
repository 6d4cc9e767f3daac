"""The pure data model: devices, claims, holders and leases (a pool's status is core.status).

Every type converts to and from plain dicts; those dicts are the wire format
of the HTTP API and of the SQLite store, so both sides share one definition.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from .errors import GpupoolError, InvalidClaim, InvalidInput, shown
from .suspension import LEASE_STATES as LEASE_STATES  # defined with the walk of the states
from .suspension import RESUMING, RUNNING, SUSPENDED, SUSPENDING, Suspension

if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple, Type, TypeVar

    from .filters import Filter

    D = TypeVar("D")

# The smallest share: a grant is at least 1 MiB per GPU, and a fraction below MIN_FRACTION is
# refused (it would round to 0 MiB on any GPU, and any number of such shares would "fit").
MIN_SHARE_MIB = 1
MIN_FRACTION = 1e-6
# Bounds of a claim's queue wait and of a lease's TTL, in seconds: the pool checks them, the
# server's schema and the CLI say them (here, so the CLI need not import the pool).
MAX_WAIT_S = 7 * 24 * 3600.0
MIN_TTL_S = 0.05
MAX_TTL_S = 24 * 3600.0
# A claim's queue, priority and preemption grace (core/queues.py has the rules that use them).
QUEUE_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
MAX_PRIORITY = 1_000_000
# A command's exit code as its runner reports it at release (a label in the lease history): 0-255.
MAX_EXIT_CODE = 255
# A preempted lease its runner did not release is reaped this long after its grace ran out.
PREEMPT_REAP_MARGIN_S = 5.0
# An idle limit (--idle-suspend): at least one watchdog sample, at most a week.
MIN_IDLE_SUSPEND_S = 1.0
MAX_IDLE_SUSPEND_S = 7 * 24 * 3600.0
# A run's wall-time limit (gpupool run --time): at least a second, at most a year.
MIN_TIME_LIMIT_S = 1.0
MAX_TIME_LIMIT_S = 365 * 24 * 3600.0
# How the lease of a run its time limit ended is kept in the history (store.schema.HISTORY_REASONS).
TIMEOUT_REASON = "timeout"
DEFAULT_PREEMPT_GRACE_S = 30.0  # what a runner waits between SIGTERM and SIGKILL when preempted
MAX_PREEMPT_GRACE_S = 3600.0
# The size of a claim. Placement costs about (requests x GPUs of the pool) and runs inside the
# server's event loop: 30,000 requests held it for 1.1 s. 256 requests cover a gang of 256 replicas
# (32 nodes of 8 GPUs) in one all-or-nothing claim; 4,096 GPUs per request is the most GPUs an
# emulated inventory may list, and far over any real node (a count over the pool's GPUs is refused
# as Unsatisfiable anyway).
MAX_REQUESTS_PER_CLAIM = 256
MAX_GPUS_PER_REQUEST = 4096
# A holder's label, name and host are text for people (a pod's 'pod:NS/NAME:UID' label is at most
# 358 characters): longer ones are refused, as they are shown in every view and written in logs.
MAX_LABEL_CHARS = 512
# Linux's PID_MAX_LIMIT (2^22, include/linux/threads.h): no pid is ever above it. holder.pid is a
# label, but one out of range (2^64, -1) is a client's mistake or a probe, never a process.
PID_MAX = 4194304


def check_queue_name(name: object, error: type = InvalidClaim) -> str:
    """`name` if it is a queue name (a DNS label), else `error` with a one-line fix."""
    if not isinstance(name, str) or not QUEUE_NAME_RE.fullmatch(name):
        raise error(
            f"queue name {name!r} is not a DNS label: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (e.g. team-a)"
        )
    return name


def check_exit_code(code: object, error: Type[GpupoolError] = InvalidInput) -> Optional[int]:
    """`code` if it is None (not said) or a whole number in [0, MAX_EXIT_CODE], else `error` naming it."""
    if code is None:
        return None
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= MAX_EXIT_CODE:
        raise error(f"exit code {code!r} must be a whole number between 0 and {MAX_EXIT_CODE} (e.g. 0), or none")
    return code


def check_priority(priority: object, error: Type[GpupoolError] = InvalidClaim, name: str = "priority") -> int:
    """`priority` if it is a whole number in the pool's bounds, else `error` naming it as `name`."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise error(f"{name} {priority!r} must be a whole number between {-MAX_PRIORITY} and {MAX_PRIORITY} (e.g. 10)")
    return priority


def _check_request_count(count: int) -> None:
    if count > MAX_REQUESTS_PER_CLAIM:
        raise InvalidClaim(
            f"a claim of {count} GPU requests is over the limit of {MAX_REQUESTS_PER_CLAIM}: ask for several GPUs "
            "in one request (count), or split the work into several claims"
        )


def check_pid(pid: object) -> int:
    """`pid` if it is a whole number in 0..PID_MAX (0: no process), else InvalidClaim with the range."""
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid <= PID_MAX:
        raise InvalidClaim(f"holder.pid {pid!r} is not a process id: give one between 1 and {PID_MAX}, or 0 for none")
    return pid


def check_label(text: str, what: str = "--label") -> str:
    """`text` if it is at most MAX_LABEL_CHARS characters long, else InvalidClaim naming it cut short."""
    if len(text) > MAX_LABEL_CHARS:
        raise InvalidClaim(
            f"{what} {shown(text)} is {len(text)} characters long, over the {MAX_LABEL_CHARS} allowed: shorten it"
        )
    return text


def _optional_seconds(
    value: object, what: str, low: float, high: float, example: int, error: Type[GpupoolError] = InvalidClaim
) -> Optional[float]:
    """`value` as seconds in [low, high], None for None; `error` naming `what` otherwise."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise error(f"{what} {value!r} must be a number of seconds between {low:g} and {high:g} (e.g. {example})")
    return float(value)


def check_idle(seconds: object, error: Type[GpupoolError] = InvalidClaim) -> Optional[float]:
    """An idle limit (--idle-suspend) in seconds, or None."""
    return _optional_seconds(seconds, "idle_suspend_s", MIN_IDLE_SUSPEND_S, MAX_IDLE_SUSPEND_S, 600, error)


def _check_grace(grace: object) -> Optional[float]:
    return _optional_seconds(grace, "preempt_grace_s", 0.0, MAX_PREEMPT_GRACE_S, 30)


class Policy(enum.Enum):
    """How placement orders candidate GPUs."""

    BINPACK = "binpack"  # fill the fullest GPU that still fits: keeps whole GPUs free
    SPREAD = "spread"  # use the emptiest GPU: least contention per job
    # least growth of expected fragmentation against the claims seen (core/fragmentation); with
    # no history yet it chooses as binpack does
    FRAGAWARE = "fragaware"

    @classmethod
    def parse(cls, text: str) -> Policy:
        try:
            return cls(str(text).lower())
        except ValueError:
            raise InvalidClaim(
                f"policy {text!r} is unknown: use 'fragaware' (default), 'binpack' or 'spread'"
            ) from None


@dataclass(frozen=True)
class Device:
    """One physical (or emulated) GPU of the pool."""

    uuid: str
    index: int
    name: str
    memory_mib: int
    node: str = "localhost"
    healthy: bool = True

    def to_dict(self) -> Dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "name": self.name,
            "memory_mib": self.memory_mib,
            "node": self.node,
            "healthy": self.healthy,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Device:
        return cls(
            uuid=str(data["uuid"]),
            index=int(data["index"]),
            name=str(data["name"]),
            memory_mib=int(data["memory_mib"]),
            node=str(data.get("node", "localhost")),
            healthy=bool(data.get("healthy", True)),
        )


@dataclass(frozen=True)
class GpuRequest:
    """N distinct GPUs, each holding a fraction of its memory or a fixed MiB."""

    count: int
    fraction: Optional[float] = None
    memory_mib: Optional[int] = None
    filters: Tuple[Filter, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise InvalidClaim(f"GPU count {self.count!r} must be a whole number >= 1 (e.g. -n 1)")
        if self.count > MAX_GPUS_PER_REQUEST:
            raise InvalidClaim(f"GPU count {self.count} is over the limit of {MAX_GPUS_PER_REQUEST} GPUs per request")
        if (self.fraction is None) == (self.memory_mib is None):
            raise InvalidClaim(
                "give exactly one of a memory fraction (-p 0.5) or a memory size per GPU (-m 8192), not "
                + ("both" if self.fraction is not None else "neither")
            )
        if self.fraction is not None and not (0 < self.fraction <= 1):
            raise InvalidClaim(f"fraction {self.fraction!r} is outside (0, 1]: use e.g. 0.5 for half of each GPU")
        if self.fraction is not None and self.fraction < MIN_FRACTION:
            raise InvalidClaim(
                f"fraction {self.fraction!r} is below the smallest share {MIN_FRACTION:g} (a grant is at least "
                f"{MIN_SHARE_MIB} MiB per GPU): ask for memory instead, e.g. -m 1 for 1 MiB"
            )
        if self.memory_mib is not None and (
            isinstance(self.memory_mib, bool) or not isinstance(self.memory_mib, int) or self.memory_mib < 1
        ):
            raise InvalidClaim(f"memory {self.memory_mib!r} MiB must be a whole number >= 1 (e.g. -m 8192)")

    def memory_on(self, device: Device) -> int:
        """MiB this request takes on `device`: a fraction of its memory rounded down to whole MiB, never below 1 MiB.

        Down, so that k shares of 1/k always fit one GPU whose MiB count k does not divide
        (an H100 reports 81,559 MiB: two halves rounded up would need 81,560); never below
        MIN_SHARE_MIB, so no share is 0. The one statement of the rule: the API's document
        (server.models) quotes the first line.
        """
        if self.memory_mib is not None:
            return self.memory_mib
        assert self.fraction is not None
        return min(device.memory_mib, max(MIN_SHARE_MIB, math.floor(self.fraction * device.memory_mib + 1e-6)))

    def accepts(self, device: Device) -> bool:
        """Whether every device filter of this request admits `device`."""
        return all(f.matches(device) for f in self.filters)

    def describe(self) -> str:
        share = f"{self.fraction:g} of the memory" if self.fraction is not None else f"{self.memory_mib}MiB"
        where = f" matching {', '.join(f.to_text() for f in self.filters)}" if self.filters else ""
        return f"{self.count} GPU(s) with {share} each{where}"

    def to_dict(self) -> Dict[str, Any]:
        return {
            "count": self.count,
            "fraction": self.fraction,
            "memory_mib": self.memory_mib,
            "filters": [f.to_text() for f in self.filters],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuRequest:
        if not isinstance(data, Mapping):
            raise InvalidClaim(f"a GPU request must be an object with count and fraction or memory_mib, got {data!r}")
        count = data.get("count", 1)
        fraction = data.get("fraction")
        memory = data.get("memory_mib")
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))):
            raise InvalidClaim(f"fraction {fraction!r} is not a number: use a value in (0, 1]")
        filters = data.get("filters") or []
        if not isinstance(filters, list):
            raise InvalidClaim(f"filters {filters!r} must be a list of 'key=value' strings")
        if filters:  # only then: a claim without filters (the common run) never loads core.filters
            from .filters import Filter
        return cls(
            count=count,
            fraction=float(fraction) if fraction is not None else None,
            memory_mib=memory,
            filters=tuple(Filter.parse(str(f)) for f in filters),
        )


@dataclass(frozen=True)
class Claim:
    """What a client asks for: one or more GPU requests, granted all together or not at all.

    A plain `gpupool run` has one request; a distributed job has one request
    per replica (a gang), so the whole job is granted or queued as one.
    """

    requests: Tuple[GpuRequest, ...]
    policy: Policy = Policy.FRAGAWARE
    queue: str = ""  # "" = no queue
    priority: int = 0  # higher first inside a queue
    preempt_grace_s: Optional[float] = None  # None = the pool's default
    # Suspend the lease once its processes kept its GPUs 0 % busy this long (None: the pool's rule).
    idle_suspend_s: Optional[float] = None

    def __post_init__(self) -> None:
        if not self.requests:
            raise InvalidClaim("a claim needs at least one GPU request")
        _check_request_count(len(self.requests))
        if self.queue != "":
            check_queue_name(self.queue)
        check_priority(self.priority)
        _check_grace(self.preempt_grace_s)
        check_idle(self.idle_suspend_s)

    @classmethod
    def single(
        cls,
        count: int,
        fraction: Optional[float] = None,
        memory_mib: Optional[int] = None,
        filters: Iterable[Filter] = (),
        policy: Policy = Policy.FRAGAWARE,
        queue: str = "",
        priority: int = 0,
        preempt_grace_s: Optional[float] = None,
        idle_suspend_s: Optional[float] = None,
    ) -> Claim:
        request = GpuRequest(count, fraction, memory_mib, tuple(filters))
        return cls((request,), policy, queue, priority, preempt_grace_s, idle_suspend_s)

    def describe(self) -> str:
        return " + ".join(r.describe() for r in self.requests)

    def to_dict(self) -> Dict[str, Any]:
        # queue, priority and grace only when set: servers and clients before queues read this too
        data: Dict[str, Any] = {"requests": [r.to_dict() for r in self.requests], "policy": self.policy.value}
        if self.queue:
            data["queue"] = self.queue
        if self.priority:
            data["priority"] = self.priority
        if self.preempt_grace_s is not None:
            data["preempt_grace_s"] = self.preempt_grace_s
        if self.idle_suspend_s is not None:
            data["idle_suspend_s"] = self.idle_suspend_s
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Claim:
        if not isinstance(data, Mapping):
            raise InvalidClaim(f"a claim must be an object with 'requests', got {data!r}")
        requests = data.get("requests")
        if not isinstance(requests, list) or not requests:
            raise InvalidClaim("claim.requests must be a non-empty list of GPU requests")
        _check_request_count(len(requests))  # before parsing each of them
        queue = data.get("queue") or ""
        if not isinstance(queue, str):
            check_queue_name(queue)  # raises with the message
        grace = data.get("preempt_grace_s")
        return cls(
            requests=tuple(GpuRequest.from_dict(r) for r in requests),
            policy=Policy.parse(data.get("policy", Policy.FRAGAWARE.value)),
            queue=queue,
            priority=data.get("priority", 0),
            preempt_grace_s=float(grace) if isinstance(grace, int) and not isinstance(grace, bool) else grace,
            idle_suspend_s=check_idle(data.get("idle_suspend_s")),
        )


def pod_uid_of_label(label: str) -> str:
    """The pod UID in a lease label written by the webhook's wrapper: 'pod:NS/NAME:UID'."""
    if not label.startswith("pod:"):
        return ""
    return label.rsplit(":", 1)[-1]


def pod_of_label(label: str) -> Tuple[str, str]:
    """(namespace, pod name) of a lease label 'pod:NS/NAME:UID'; ('', '') for any other label."""
    if not label.startswith("pod:"):
        return "", ""
    namespace, _, name = label[4:].rsplit(":", 1)[0].partition("/")
    return (namespace, name) if namespace and name else ("", "")


def prechecked(cls: Type[D], **values: Any) -> D:
    """An instance of the frozen dataclass `cls` (GpuRequest, Claim) from values that the same rules
    have checked already: the API's request models (server/models.py) state every rule of
    `__post_init__` with this module's constants, so an HTTP claim's rules are checked once.
    A field not given takes its default."""
    made = object.__new__(cls)
    for spec in dataclasses.fields(cls):  # type: ignore[arg-type]  # D is a dataclass
        if spec.name in values:
            value = values[spec.name]
        elif spec.default is not dataclasses.MISSING:
            value = spec.default
        else:
            value = spec.default_factory()  # type: ignore[operator]  # a field without either is given
        object.__setattr__(made, spec.name, value)  # as a frozen dataclass's own __init__ does
    return made


class Holder(NamedTuple):
    """Who holds a lease: token or user name, process, host and a free label (pod UID ...)."""

    name: str = ""
    pid: int = 0
    host: str = ""
    label: str = ""

    def describe(self) -> str:
        """For logs: the name (the token's, with auth), then the process and host the client gave,
        marked as its word (no pid of a holder is ever acted on: the watchdog goes by what the
        kernel says, enforcement/attribution.py), then the label."""
        said = [f"holder pid {self.pid}"] if self.pid else []
        if self.host:
            said.append(f"host {self.host}")
        claimed = f" ({', '.join(said)}, as the client says)" if said else ""
        return (self.name or "?") + claimed + (f" [{self.label}]" if self.label else "")

    @property
    def pod_uid(self) -> str:
        """The pod UID of a holder labelled by the webhook's wrapper ('pod:NS/NAME:UID'), else ''."""
        return pod_uid_of_label(self.label)

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "host": self.host, "label": self.label}

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]], recorded: bool = False) -> Holder:
        """The holder of a request (InvalidClaim for a pid out of range) or, `recorded`, of a lease
        the pool kept from before that check (a stored row, a server's answer): such a pid reads as 0."""
        data = data or {}
        try:
            pid = int(data.get("pid", 0) or 0)
        except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's 1e400 is inf
            raise InvalidClaim(f"holder.pid {data.get('pid')!r} must be an integer") from None
        if recorded and not 0 <= pid <= PID_MAX:
            pid = 0
        return cls(
            name=str(data.get("name", "") or ""),
            pid=check_pid(pid),
            host=str(data.get("host", "") or ""),
            label=str(data.get("label", "") or ""),
        )


def local_user() -> str:
    """This process's user name, as getpass.getuser() finds it (without importing getpass and
    termios): what a lease's holder is called without a token, and who acts on an embedded pool."""
    name = next((os.environ[k] for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if os.environ.get(k)), "")
    if name:
        return name
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):  # no passwd entry in some containers
        return f"uid{os.getuid()}"


class Slice(NamedTuple):
    """Memory of one device held by a lease, for request number `group` of its claim."""

    device_uuid: str
    memory_mib: int
    group: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return {"uuid": self.device_uuid, "memory_mib": self.memory_mib, "group": self.group}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Slice:
        return cls(str(data["uuid"]), int(data["memory_mib"]), int(data.get("group", 0)))


@dataclass(frozen=True)
class Lease:
    """A granted claim: slices of devices held until released or expired."""

    id: str
    holder: Holder
    slices: Tuple[Slice, ...]
    ttl_s: float
    created_at: float
    expires_at: float
    queue: str = ""
    priority: int = 0
    preempt_grace_s: float = DEFAULT_PREEMPT_GRACE_S  # between SIGTERM and SIGKILL once preempted
    preempted_at: Optional[float] = None  # set when the pool told its holder to stop
    suspension: Optional[Suspension] = None  # None: running (core/suspension.py has the states)
    idle_suspend_s: Optional[float] = None  # its claim's idle limit (None: the pool's rule)

    @property
    def state(self) -> str:
        """running, suspending, suspended or resuming (core.suspension's words)."""
        return RUNNING if self.suspension is None else self.suspension.state

    @property
    def needs_runner(self) -> bool:
        """Whether its runner has a step to take now: stop (preempted), park or restore."""
        return self.preempted_at is not None or self.state in (SUSPENDING, RESUMING)

    def group(self, index: int) -> Tuple[Slice, ...]:
        """The slices granted for request number `index` of the claim."""
        return tuple(s for s in self.slices if s.group == index)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "id": self.id,
            "holder": self.holder.to_dict(),
            "devices": [s.to_dict() for s in self.slices],
            "ttl_s": self.ttl_s,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "queue": self.queue,
            "priority": self.priority,
            "preempt_grace_s": self.preempt_grace_s,
            "preempted_at": self.preempted_at,
            "state": self.state,
            "suspension": None if self.suspension is None else self.suspension.to_dict(),
            "idle_suspend_s": self.idle_suspend_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Lease:
        preempted_at = data.get("preempted_at")
        suspension = data.get("suspension")
        if suspension is not None:
            suspension = Suspension.from_dict(suspension)
        return cls(
            id=str(data["id"]),
            holder=Holder.from_dict(data.get("holder"), recorded=True),
            slices=tuple(Slice.from_dict(s) for s in data["devices"]),
            ttl_s=float(data["ttl_s"]),
            created_at=float(data["created_at"]),
            expires_at=float(data["expires_at"]),
            queue=str(data.get("queue", "") or ""),
            priority=int(data.get("priority", 0) or 0),
            preempt_grace_s=float(data.get("preempt_grace_s", DEFAULT_PREEMPT_GRACE_S)),
            preempted_at=float(preempted_at) if preempted_at is not None else None,
            suspension=suspension,
            idle_suspend_s=check_idle(data.get("idle_suspend_s")),
        )


def allocated_by_device(leases: Iterable[Lease]) -> Dict[str, int]:
    """MiB held on each device uuid, summed over `leases`."""
    used: Dict[str, int] = {}
    for lease in leases:
        for s in lease.slices:
            used[s.device_uuid] = used.get(s.device_uuid, 0) + s.memory_mib
    return used


def reap_at(lease: Lease) -> Optional[float]:
    """When the pool reclaims a preempted lease its runner did not release (None: not preempted)."""
    if lease.preempted_at is None:
        return None
    return lease.preempted_at + lease.preempt_grace_s + PREEMPT_REAP_MARGIN_S


__all__: List[str] = [
    "RUNNING",
    "SUSPENDING",
    "SUSPENDED",
    "RESUMING",
    "LEASE_STATES",
    "Policy",
    "Device",
    "GpuRequest",
    "Claim",
    "Holder",
    "Slice",
    "Lease",
    "allocated_by_device",
    "pod_of_label",
    "pod_uid_of_label",
    "check_queue_name",
    "QUEUE_NAME_RE",
    "MAX_PRIORITY",
    "DEFAULT_PREEMPT_GRACE_S",
    "MAX_PREEMPT_GRACE_S",
    "MAX_REQUESTS_PER_CLAIM",
    "MAX_GPUS_PER_REQUEST",
    "PID_MAX",
    "check_pid",
    "MAX_LABEL_CHARS",
    "check_label",
    "check_idle",
    "PREEMPT_REAP_MARGIN_S",
    "MIN_IDLE_SUSPEND_S",
    "MIN_TIME_LIMIT_S",
    "MAX_TIME_LIMIT_S",
    "TIMEOUT_REASON",
    "MAX_IDLE_SUSPEND_S",
    "reap_at",
]
