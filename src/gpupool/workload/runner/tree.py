"""The runner's view of its child's process tree: end all of it, reap what it left behind."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ...logs import get_logger
from ...pooling.isolation.proctree import alive, descendants, group_members, lease_id_of, process_table, terminate

if TYPE_CHECKING:
    from typing import Iterable, List, Optional, Set, Tuple

log = get_logger(__name__)

# A tree can fork while it is being ended (a shell starting its next job): look again until
# nothing is left, for at most this long (a fork bomb outside a cgroup is not outrun).
SWEEP_S = 5.0


def tree_pids(child_pgid: Optional[int], exclude: Iterable[int] = (), lease_id: Optional[str] = None) -> List[int]:
    """Every process that belongs to this run: the runner's descendants (orphans re-parent to the
    guard or the runner, subreapers), the child's process group, and, given `lease_id`, every process started with it."""
    if lease_id is None and _nothing_left(child_pgid, set(exclude)):
        return []
    me = os.getpid()
    table = process_table()
    pids = set(descendants(me, table))
    if child_pgid is not None:
        pids.update(group_members(child_pgid, table))
    if lease_id is not None:
        pids.update(pid for pid in table if lease_id_of(pid) == lease_id)
    pids.difference_update(exclude)
    pids.discard(me)
    return sorted(pids)


def _children(pid: str) -> Set[int]:
    """The children of every thread of `pid` ("self" or a number), from /proc/PID/task/TID/children."""
    found: Set[int] = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
            found.update(int(x) for x in handle.read().split())
    return found


def _nothing_left(child_pgid: Optional[int], exclude: Set[int]) -> bool:
    """Whether `tree_pids` (without a lease id) would find nothing, told from a few small files
    rather than a read of every process in /proc: this process has no children but `exclude`,
    those have none, and no process is in group `child_pgid`. False when unsure."""
    try:
        children = _children("self")
        if children - exclude or any(_children(str(pid)) for pid in children):
            return False
    except (OSError, ValueError):  # a kernel without these files, or a child that just ended
        return False
    if child_pgid is None:
        return True
    try:
        os.killpg(child_pgid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's process is in that group
        return False
    return False


def end_tree(
    child_pgid: Optional[int], grace_s: float, exclude: Iterable[int] = (), lease_id: Optional[str] = None
) -> List[int]:
    """SIGTERM the whole tree, SIGKILL what is left after `grace_s`, again for what was forked
    meanwhile, until nothing is left; returns the SIGKILLed pids."""
    skip = set(exclude)
    killed: List[int] = []
    deadline = time.monotonic() + SWEEP_S
    while True:
        # Zombies are ended already: their parent (the guard, this process) collects them.
        pids = [pid for pid in tree_pids(child_pgid, skip, lease_id) if alive(pid)]
        if not pids:
            break
        killed += terminate(pids, grace_s)
        if time.monotonic() > deadline:
            log.warning("processes of the run kept forking for %.0fs while being ended", SWEEP_S)
            break
    if killed:
        log.debug("SIGKILLed %s after %.1fs", killed, grace_s)
    return killed


def reap_all() -> List[Tuple[int, int]]:
    """Collect every ended child (zombie) of this process; returns (pid, wait status) of each. Call it
    only after the main child's Popen.wait() returned, or it would steal that exit status."""
    ended: List[Tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.append((pid, status))


def reap_orphans(keep: Iterable[int]) -> int:
    """Collect ended children other than `keep` (the main child, the guard) while the run goes on:
    orphans re-parented to the subreaper would otherwise pile up as zombies."""
    me = os.getpid()
    skip = set(keep)
    count = 0
    for pid, info in process_table().items():
        if info.ppid != me or pid in skip:
            continue
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        count += bool(done)
    return count
