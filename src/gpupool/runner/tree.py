"""The runner's view of its child's process tree: end all of it, reap what it left behind."""

from __future__ import annotations

import os
from typing import Iterable, List, Optional

from ..isolation.proctree import descendants, group_members, lease_id_of, process_table, terminate
from ..logs import get_logger

log = get_logger(__name__)


def tree_pids(child_pgid: Optional[int], exclude: Iterable[int] = (), lease_id: Optional[str] = None) -> List[int]:
    """Every process that belongs to this run: the runner's descendants (orphans re-parent to it,
    a subreaper), the child's process group, and, given `lease_id`, every process started with it."""
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


def end_tree(
    child_pgid: Optional[int], grace_s: float, exclude: Iterable[int] = (), lease_id: Optional[str] = None
) -> List[int]:
    """SIGTERM the whole tree, SIGKILL what is left after `grace_s`; returns the SIGKILLed pids."""
    killed = terminate(tree_pids(child_pgid, exclude, lease_id), grace_s)
    if killed:
        log.debug("SIGKILLed %s after %.1fs", killed, grace_s)
    return killed


def reap_all() -> int:
    """Collect every ended child (zombie) of this process; returns how many. Call it only after the
    main child's Popen.wait() returned, or it would steal that exit status."""
    count = 0
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return count
        if pid == 0:
            return count
        count += 1


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
