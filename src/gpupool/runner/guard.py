"""The guard: a forked copy of the runner that ends the lease's processes when the runner dies.

The parent-death signal reaches only the runner's direct child; grandchildren and setsid'd
daemons would keep running on the GPUs of a lease that is reclaimed after its TTL. The guard
blocks on a pipe whose write end only the runner holds; EOF without the runner's "done" line means
the runner is gone (kill -9 included), and the guard ends the child's process group and every
process started with GPUPOOL_LEASE_ID=<this lease>, then exits. A fork, not a new interpreter:
it costs the runner about a millisecond.
"""

from __future__ import annotations

import os
import signal

from .. import TYPE_CHECKING
from ..isolation.proctree import alive, lease_id_of, process_table, terminate
from ..logs import get_logger

if TYPE_CHECKING:
    from typing import Optional

log = get_logger(__name__)

_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# New processes can appear while the first sweep runs (a shell forking): look again, a few times.
_SWEEPS = 3


class Guard:
    """The runner's handle on its guard process."""

    def __init__(self, pid: int, write_fd: int) -> None:
        self.pid = pid
        self._fd: Optional[int] = write_fd

    @classmethod
    def spawn(cls, lease_id: str, grace_s: float) -> Optional[Guard]:
        """Fork the guard for `lease_id`; None where there is no /proc to find processes in.

        Call it before any thread starts: the forked copy must not inherit a held lock.
        """
        if not os.path.isdir("/proc/self/fd"):
            log.debug("no /proc: no guard, kill -9 of the runner leaves the tree to its parent-death signal")
            return None
        read_fd, write_fd = os.pipe()  # both close-on-exec: the child never holds them
        # Blocked until the guard ignores them, so a Ctrl-C right at the fork cannot run the
        # runner's Python handler in the guard.
        signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED)
        try:
            pid = os.fork()
            if pid == 0:
                _serve(read_fd, lease_id, grace_s)  # never returns
        except OSError as err:  # out of processes: run unguarded rather than not at all
            log.warning("could not start the guard (%s): kill -9 of the runner would leave daemons running", err)
            os.close(read_fd)
            os.close(write_fd)
            return None
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
        os.close(read_fd)
        return cls(pid, write_fd)

    def watch(self, pgid: int) -> None:
        """Tell the guard the child's process group (it ends it if the runner dies)."""
        self._send(b"g%d\n" % pgid)

    def done(self) -> None:
        """The runner ended the tree itself: the guard may exit without a sweep."""
        self._send(b"d\n")
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def collect(self) -> None:
        """Reap the guard if it has exited (it exits at once after `done`)."""
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def _send(self, line: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, line)
        except OSError:  # the guard died: nothing to tell, the runner still ends the tree itself
            log.debug("guard %d is gone", self.pid)


def _serve(read_fd: int, lease_id: str, grace_s: float) -> None:
    """The guard's whole life, in the forked process; always leaves with os._exit."""
    try:
        for signum in _IGNORED:
            signal.signal(signum, signal.SIG_IGN)
        os.setpgid(0, 0)  # out of the runner's group: a Ctrl-C to it must not reach the guard
        _close_all_but(read_fd)
        pgid = _wait_for_runner(read_fd)
        if pgid is not None:
            _sweep(lease_id, pgid, grace_s)
    finally:
        os._exit(0)  # no atexit, no finalizers of the runner's copied state


def _close_all_but(keep: int) -> None:
    """Close every inherited fd (pipes of whoever waits for the runner's output, sockets, the DB)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd != keep:
            try:
                os.close(fd)
            except OSError:  # the listing's own fd, already closed
                pass


def _wait_for_runner(read_fd: int) -> Optional[int]:
    """Read the runner's lines until EOF; the child's pgid (0 if none yet), or None after "done"."""
    pgid = 0
    pending = b""
    while True:
        try:
            data = os.read(read_fd, 256)
        except OSError:
            data = b""
        if not data:
            return pgid
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line == b"d":
                return None
            if line.startswith(b"g") and line[1:].isdigit():
                pgid = int(line[1:])


def _sweep(lease_id: str, pgid: int, grace_s: float) -> None:
    """End the child's process group and every process of the lease (SIGTERM, grace, SIGKILL)."""
    me = os.getpid()
    for _ in range(_SWEEPS):
        table = process_table()
        targets = [
            pid
            for pid, info in table.items()
            if pid != me and ((pgid > 0 and info.pgid == pgid) or lease_id_of(pid) == lease_id) and alive(pid)
        ]
        if not targets:
            return
        terminate(targets, grace_s)
