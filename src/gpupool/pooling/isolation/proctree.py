"""Process trees from Linux /proc (stdlib only): who descends from whom, which lease or pod a process
belongs to, and the one stop of processes and process groups (SIGTERM, grace, SIGKILL): `terminate`.

Used by the runner (its child's whole tree ends with the lease) and by the server-side watchdog
(which processes on a GPU belong to which lease). Every reader tolerates processes that vanish
while it reads: a pid that is gone is simply skipped.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, NamedTuple

from .env import LEASE_ID_ENV

if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional, Set, Tuple

PROC = "/proc"
# A ppid chain longer than this is a loop in a racy snapshot, not a real tree (pid_max is 4M,
# but real trees are a few dozen deep).
MAX_DEPTH = 4096
_POLL_S = 0.01
# After SIGKILL the kernel still needs a moment to tear a process down; wait at most this long.
_KILL_SETTLE_S = 1.0


class ProcessInfo(NamedTuple):
    """One process: its id, its parent's and its process group's."""

    pid: int
    ppid: int
    pgid: int


def stat_fields(pid: int, proc_root: str = PROC) -> Optional[List[str]]:
    """The fields of /proc/PID/stat after the command name (state first), or None if it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # comm may hold spaces and ')' itself: the real end of it is the LAST ')'.
    end = data.rfind(b")")
    if end < 0:
        return None
    fields = data[end + 1 :].split()
    return [f.decode("ascii", "replace") for f in fields] if len(fields) >= 3 else None


def read_process(pid: int, proc_root: str = PROC) -> Optional[ProcessInfo]:
    """`pid` as a ProcessInfo, or None when it does not exist (any more)."""
    fields = stat_fields(pid, proc_root)
    if fields is None:
        return None
    try:
        return ProcessInfo(pid, int(fields[1]), int(fields[2]))
    except ValueError:
        return None


def process_table(proc_root: str = PROC) -> Dict[int, ProcessInfo]:
    """Every process visible in /proc, by pid (a snapshot: some may be gone already)."""
    table: Dict[int, ProcessInfo] = {}
    try:
        names = os.listdir(proc_root)
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        info = read_process(int(name), proc_root)
        if info is not None:
            table[info.pid] = info
    return table


def descendants(pid: int, table: Optional[Dict[int, ProcessInfo]] = None) -> List[int]:
    """All processes below `pid` (children, grandchildren ...) in `table`, parents before children."""
    table = process_table() if table is None else table
    children: Dict[int, List[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: List[int] = []
    seen: Set[int] = {pid}
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(0), ()):
            if child not in seen:  # a racy snapshot can hold a cycle through a reused pid
                seen.add(child)
                found.append(child)
                queue.append(child)
    return found


def group_members(pgid: int, table: Optional[Dict[int, ProcessInfo]] = None) -> List[int]:
    """The processes of process group `pgid` in `table`."""
    table = process_table() if table is None else table
    return sorted(info.pid for info in table.values() if info.pgid == pgid)


def is_descendant(pid: int, ancestor: int, table: Optional[Dict[int, ProcessInfo]] = None) -> bool:
    """Whether `ancestor` is on `pid`'s parent chain (not counting `pid` itself)."""
    table = process_table() if table is None else table
    current = pid
    for _ in range(MAX_DEPTH):
        info = table.get(current)
        if info is None or info.ppid <= 0 or info.ppid == current:
            return False
        if info.ppid == ancestor:
            return True
        current = info.ppid
    return False


def lease_id_of(pid: int, proc_root: str = PROC) -> Optional[str]:
    """The GPUPOOL_LEASE_ID `pid` was started with, or None (absent, gone, or not ours to read)."""
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    prefix = LEASE_ID_ENV.encode() + b"="
    for entry in data.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :].decode("utf-8", "replace") or None
    return None


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (a zombie has ended; only its status is left).

    The one answer to "is this pid alive" (runner, pool, jobs). A pid <= 0 names no single
    process (0 is our own group, -1 every process, -N group N), so it is never alive; callers
    for whom 0 means "pid unknown" decide that themselves.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, but someone else's
    fields = stat_fields(pid)
    if fields is None:
        # Reaped since the kill above; or no /proc (not Linux), where the kill is all we know.
        return not os.path.isdir(PROC)
    return fields[0] not in ("Z", "X", "x")


def terminate(
    pids: Iterable[int], grace_s: float, groups: Iterable[int] = (), reap: Optional[Callable[[], object]] = None
) -> List[int]:
    """The one process stop: SIGTERM `pids` and process groups `groups`, up to `grace_s` for them to
    go, then SIGKILL what is left; returns the pids and group ids that needed SIGKILL.

    Pids or groups already gone or not ours to signal are skipped; this process, its own group and
    init never are signalled. `reap`, called while waiting, collects the caller's own ended
    children (Popen.poll): an unreaped zombie still counts as a live member of its group.
    """
    me, my_group = os.getpid(), os.getpgrp()
    targets: List[Tuple[int, bool]] = []  # (id, is a group)
    for pid in dict.fromkeys(pids):  # unique, order kept
        if pid > 1 and pid != me and _signal(pid, False, signal.SIGTERM):
            targets.append((pid, False))
    for pgid in dict.fromkeys(groups):
        if pgid > 1 and pgid != my_group and _signal(pgid, True, signal.SIGTERM):
            targets.append((pgid, True))
    remaining = _wait_gone(targets, grace_s, reap)
    killed = [target for target in remaining if _signal(*target, signal.SIGKILL)]
    _wait_gone(killed, _KILL_SETTLE_S, reap)
    return [ident for ident, _ in killed]


def send_signal(pid: int, signum: int) -> bool:
    """Send `signum` to process `pid`; False when it is gone."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def _signal(ident: int, group: bool, signum: int) -> bool:
    """Send `signum` to a process or a process group; False when it is gone or not ours."""
    try:
        (os.killpg if group else os.kill)(ident, signum)
        if signum == signal.SIGTERM:
            # A stopped process would hold SIGTERM until continued: let it see it now.
            (os.killpg if group else os.kill)(ident, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _running(ident: int, group: bool, table: Optional[Dict[int, ProcessInfo]]) -> bool:
    """Whether a process, or any process of a group, is still there and not a zombie (an orphaned
    zombie waits for init, which may take its time: it has ended all the same)."""
    if not group:
        return alive(ident)
    try:
        os.killpg(ident, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return any(alive(pid) for pid in group_members(ident, table))


def _wait_gone(
    targets: List[Tuple[int, bool]], timeout_s: float, reap: Optional[Callable[[], object]]
) -> List[Tuple[int, bool]]:
    """Poll until every target is gone, or `timeout_s` passes; returns those still there."""
    remaining = targets
    deadline = time.monotonic() + max(timeout_s, 0.0)
    while True:
        # One read of /proc a round, and only while a group is waited for.
        table = process_table() if any(group for _, group in remaining) else None
        remaining = [target for target in remaining if _running(*target, table)]
        if reap is not None:
            reap()  # after the look: what just ended is collected before this returns
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(_POLL_S)
