"""What the node itself knows about a process (stdlib only): the kernel's word, never a request's.

- Who is on the other end of a local Unix socket: SO_PEERCRED (pid, uid), set by the kernel at
  connect time; a caller cannot choose it.
- When a pid started (/proc/PID/stat field 22, clock ticks since boot): a pid the kernel gave to
  another process since has another start time.
- A process's parent chain (the process table), its Kubernetes pod (the pod UID in its cgroup,
  only below the kubelet's `kubepods` hierarchy, which no pod and no user can create) and the
  lease id in its environment (which any process can set: a hint, never proof).
- Whether a process descends from a given one (the node's MPS control daemon, named by its pid and
  start time): the process table's word, never a process's name or command line, which any user sets.

Attribution (enforcement/attribution.py) consumes only this module.
"""

from __future__ import annotations

import os
import re
import socket
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from . import proctree

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple

# struct ucred {pid_t pid; uid_t uid; gid_t gid;}
_UCRED = struct.Struct("3i")
# /proc/PID/stat: field 22 is starttime; proctree's fields start at field 3 (state).
_START_FIELD = 22 - 3


@dataclass(frozen=True)
class Witness:
    """A process the node vouches for: its pid with the start time it had, its uid, its pod ('' outside)."""

    pid: int
    start_ticks: int
    uid: int
    pod_uid: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks, "uid": self.uid, "pod_uid": self.pod_uid}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Witness:
        return cls(int(data["pid"]), int(data["start_ticks"]), int(data["uid"]), str(data.get("pod_uid") or ""))


def peer_credentials(sock: socket.socket) -> Tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected `sock` (a Unix stream socket), from the kernel.

    The pid is in this process's pid namespace; 0 when the peer lives in a namespace we cannot see.
    """
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


# The pod UID in a cgroup path: cgroupfs driver `.../pod<uid>/...` (dashes), systemd driver
# `kubepods-<qos>-pod<uid>.slice` (underscores). Static pods have a 32-hex UID without dashes.
_POD_PATTERN = (
    r"(?:^|[/-])pod("
    r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
    r"|[0-9a-fA-F]{32}"
    r")(?:\.slice)?(?=/|$)"
)


def start_ticks(pid: int, proc_root: str = proctree.PROC) -> Optional[int]:
    """When `pid` started, in clock ticks since boot; None when it is gone."""
    fields = proctree.stat_fields(pid, proc_root)
    if fields is None or len(fields) <= _START_FIELD:
        return None
    try:
        return int(fields[_START_FIELD])
    except ValueError:
        return None


def uptime_ticks(proc_root: str = proctree.PROC) -> Optional[int]:
    """Clock ticks since boot now (the scale of `start_ticks`), or None without /proc."""
    try:
        with open(f"{proc_root}/uptime", "rb") as handle:
            # Exact: float("10395.05") * 100 is 1039504.99..., a tick short of a process that
            # started in that very tick, which would then look born after "now".
            seconds = Fraction(handle.read().split()[0].decode())
    except (OSError, ValueError, IndexError, ZeroDivisionError):
        return None
    return int(seconds * os.sysconf("SC_CLK_TCK"))


def kube_pod_uid(pid: int, proc_root: str = proctree.PROC) -> Optional[str]:
    """The pod UID in `pid`'s cgroup when that cgroup lies below the kubelet's `kubepods` hierarchy.

    A user with a delegated cgroup subtree can name a cgroup `pod<uid>`, but only below its own
    slice (user.slice ...), never below kubepods: the path's first real component decides.
    """
    try:
        with open(f"{proc_root}/{pid}/cgroup", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)  # "ID:controllers:/path"
        if len(parts) != 3:
            continue
        # A reader in a private cgroup namespace sees others' paths as /../../kubepods...
        components = [c for c in parts[2].split("/") if c and c != ".."]
        if not components or not components[0].startswith("kubepods"):
            continue
        match = re.search(_POD_PATTERN, "/" + "/".join(components))
        if match:
            return match.group(1).replace("_", "-").lower()
    return None


def witness_peer(sock: socket.socket, accepted_ticks: Optional[int]) -> Optional[Witness]:
    """The process connected on `sock` as a Witness, or None when the node cannot vouch for it.

    None for a peer outside our pid namespace (pid 0), init, a pid gone since, or a pid that
    started after the connection was accepted (`accepted_ticks`): that is a reused pid, not the peer.
    """
    pid, uid, _ = peer_credentials(sock)
    if pid <= 1:
        return None
    started = start_ticks(pid)
    if started is None or (accepted_ticks is not None and started > accepted_ticks):
        return None
    return Witness(pid, started, uid, kube_pod_uid(pid) or "")


class NodeView:
    """One look at the node's processes for one watchdog sample: read lazily, each at most once."""

    def __init__(
        self,
        proc_root: str = proctree.PROC,
        pod_of: Callable[[int], Optional[str]] = kube_pod_uid,
        lease_env_of: Callable[[int], Optional[str]] = proctree.lease_id_of,
    ) -> None:
        self.proc_root = proc_root
        self._pod_of = pod_of
        self._lease_env_of = lease_env_of
        self._table: Optional[Dict[int, proctree.ProcessInfo]] = None
        self._started: Dict[int, Optional[int]] = {}

    def started(self, pid: int) -> Optional[int]:
        """`pid`'s start time in clock ticks (None: gone)."""
        if pid not in self._started:
            self._started[pid] = start_ticks(pid, self.proc_root)
        return self._started[pid]

    def lineage(self, pid: int) -> Iterator[int]:
        """`pid`, then its parent, grandparent ... up to init (a racy snapshot's loop is cut)."""
        if self._table is None:
            self._table = proctree.process_table(self.proc_root)
        seen = set()
        current = pid
        for _ in range(proctree.MAX_DEPTH):
            if current <= 0 or current in seen:
                return
            seen.add(current)
            yield current
            info = self._table.get(current)
            if info is None or info.ppid == current:
                return
            current = info.ppid

    def descends_from(self, pid: int, ancestor: int, ancestor_started: int) -> bool:
        """Whether `pid` is, or descends from, `ancestor` in the process table, `ancestor` being the
        very process that started at `ancestor_started` (not a later one given its pid)."""
        return self.started(ancestor) == ancestor_started and ancestor in self.lineage(pid)

    def pod_of(self, pid: int) -> Optional[str]:
        """The pod UID of `pid`'s kubepods cgroup (None outside a pod)."""
        return self._pod_of(pid)

    def lease_env_of(self, pid: int) -> Optional[str]:
        """The GPUPOOL_LEASE_ID in `pid`'s environment: a hint that any process can set."""
        return self._lease_env_of(pid)
