"""Linux prctl() through ctypes: the runner as child subreaper, the child with a parent-death signal.

On other systems (or a libc without prctl) both are skipped with a debug log: the runner still
ends the tree it can see at release, only kill -9 of the runner is not covered there.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING

from ...logs import get_logger

if TYPE_CHECKING:
    from typing import Callable, Optional

    _Prctl = Callable[[int, int, int, int, int], int]

log = get_logger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_resolved: Optional[_Prctl] = None
_looked_up = False


def _prctl() -> Optional[_Prctl]:
    """libc's prctl, resolved once (never between fork and exec: dlsym there is not safe)."""
    global _resolved, _looked_up
    if _looked_up:
        return _resolved
    _looked_up = True
    if not sys.platform.startswith("linux"):
        log.debug("prctl: not Linux (%s), no subreaper and no parent-death signal", sys.platform)
        return None
    try:
        import ctypes

        func = ctypes.CDLL(None, use_errno=True).prctl
        func.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        func.restype = ctypes.c_int
    except (OSError, AttributeError, ImportError) as err:
        log.debug("prctl: unavailable (%s)", err)
        return None
    _resolved = func
    return _resolved


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (not init), so the runner still sees
    them at release; returns whether that worked."""
    prctl = _prctl()
    if prctl is None:
        return False
    if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        log.debug("prctl(PR_SET_CHILD_SUBREAPER) failed")
        return False
    return True


def parent_death_signal(sig: int = signal.SIGKILL) -> Optional[Callable[[], None]]:
    """A preexec_fn that has the kernel send `sig` to the child when this process dies, or None
    where prctl is unavailable. Resolves prctl now, before any fork."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:  # runs in the forked child before exec: no imports, no locks
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the runner died before the signal was armed
            os._exit(1)  # the forked child, before exec: the runner's exit handlers are not its own

    return arm
