"""The guard: a forked copy of the runner that starts the command, is its subreaper, and ends the
lease's processes when the runner dies.

The parent-death signal reaches only a direct child, and a process can leave its group, session
and GPUPOOL_LEASE_ID behind (`env -u ... setsid`, a double fork). So the guard is the command's
parent and a child subreaper: every orphan of the tree re-parents to it, never to init, while it
lives; where cgroup v2 is writable the guard starts the command inside the lease's own cgroup
(`spawn.py`: a member before its first instruction, and so is all it ever forks), which is then
frozen and killed as a whole. The guard blocks on a pipe whose write end only the runner holds;
EOF without the runner's "done" line means the runner is gone (kill -9 included): the guard kills
the cgroup, ends its descendants, the command's group and every process started with
GPUPOOL_LEASE_ID=<this lease>, removes the run's folder, and exits. It relays the command's exit
status to the runner over a second pipe. A fork, not a new interpreter: it costs the runner about
a millisecond.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import GpupoolError, InvalidInput
from ...logs import get_logger
from .child import start
from .prctl import become_subreaper, parent_death_signal
from .tree import end_tree, reap_all
from .workdir import remove_tree

if TYPE_CHECKING:
    from typing import Mapping, Optional, Sequence, Set, Tuple, Union

    from ...pooling.isolation.cgroup import LeaseCgroup
    from .spawn import Born

    # The command as the guard started it: what has its pid (kept referenced until it is reaped).
    Started = Union[subprocess.Popen[bytes], Born]

log = get_logger(__name__)

_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Lines on the guard's report pipe: the command's pid, why it could not start (bad input, other),
# and its exit status (Popen's returncode: -N for signal N).
_PID, _INVALID, _FAILED, _EXIT = b"p", b"e", b"f", b"x"
_DONE = b"d\n"


class GuardedChild:
    """The command as the runner sees it when the guard started it: Popen's pid, poll, wait and
    send_signal, with the exit status read from the guard's report pipe."""

    def __init__(self, pid: int, report_fd: int, pending: bytes) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None
        self._fd: Optional[int] = report_fd
        self._pending = pending
        self._parse()

    def poll(self) -> Optional[int]:
        """The exit status if the guard has reported it, without blocking."""
        if self.returncode is None and self._fd is not None and select.select([self._fd], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the command has ended (subprocess.TimeoutExpired after `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None and self._fd is not None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left is not None and not select.select([self._fd], [], [], left)[0]:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            # Safe against a signal handler's poll() reading first: the guard closes the pipe
            # right after the status, so this read then sees EOF at once.
            self._read()
        return -signal.SIGKILL if self.returncode is None else self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def _read(self) -> None:
        if self._fd is None:
            return
        data = os.read(self._fd, 256)
        if data:
            self._pending += data
            self._parse()
            return
        os.close(self._fd)
        self._fd = None
        if self.returncode is None:  # the guard died without a word: its parent-death signal ended the command
            log.warning("the guard ended before the command: its exit status is lost")
            self.returncode = -signal.SIGKILL

    def _parse(self) -> None:
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            if line[:1] == _EXIT:
                self.returncode = int(line[1:])


class Guard:
    """The runner's handle on its guard process."""

    def __init__(self, pid: int, control_fd: int, report_fd: int, cgroup: Optional[LeaseCgroup]) -> None:
        self.pid = pid
        self.cgroup = cgroup
        self._control: Optional[int] = control_fd
        self._report = report_fd

    @classmethod
    def spawn(
        cls, lease_id: str, grace_s: float, command: Sequence[str], env: Mapping[str, str], workdir: Optional[Path]
    ) -> Optional[Guard]:
        """Fork the guard for `lease_id`, which starts `command` (read it with `child()`); None where
        there is no /proc to find processes in or no process to fork: start the command directly.

        Call it before any thread starts: the forked copy must not inherit a held lock.
        """
        if not os.path.isdir("/proc/self/fd"):
            log.debug("no /proc: no guard, kill -9 of the runner leaves the tree to its parent-death signal")
            return None
        from ...pooling.isolation.cgroup import LeaseCgroup  # only a guarded run reads the cgroup files

        cgroup = LeaseCgroup.create(lease_id)
        control_r, control_w = os.pipe()  # all close-on-exec: the command never holds them
        report_r, report_w = os.pipe()
        # Blocked until the guard ignores them, so a Ctrl-C right at the fork cannot run the
        # runner's Python handler in the guard.
        signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED)
        # What the runner has built so far (its modules, the pool, the claim) lives until it exits:
        # frozen, no later collection walks it, neither the guard's, which would copy every page
        # of it (the gc docs' advice for a fork without exec), nor the runner's, its last at exit.
        gc.freeze()
        try:
            pid = os.fork()
            if pid == 0:
                _serve(control_r, report_w, lease_id, grace_s, command, env, workdir, cgroup)  # never returns
        except OSError as err:  # out of processes: run unguarded rather than not at all
            log.warning("could not start the guard (%s): kill -9 of the runner would leave daemons running", err)
            for fd in (control_r, control_w, report_r, report_w):
                os.close(fd)
            if cgroup is not None:
                cgroup.remove()
            return None
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
        os.close(control_r)
        os.close(report_w)
        return cls(pid, control_w, report_r, cgroup)

    def child(self) -> GuardedChild:
        """The command the guard started; InvalidInput (or GpupoolError) when it could not start."""
        pending = b""
        while b"\n" not in pending:
            data = os.read(self._report, 256)
            if not data:
                raise GpupoolError("the guard ended before it started the command")
            pending += data
        line, pending = pending.split(b"\n", 1)
        message = line[1:].decode("utf-8", "replace")
        if line[:1] == _INVALID:
            raise InvalidInput(message)
        if line[:1] != _PID:
            raise GpupoolError(f"could not start the command: {message}")
        return GuardedChild(int(message), self._report, pending)

    def end_cgroup(self) -> None:
        """Kill what is left in the lease's cgroup (what no tree walk saw) and remove it."""
        if self.cgroup is not None and not self.cgroup.remove():
            log.warning("could not remove the lease's cgroup %s: a process in it does not end", self.cgroup.path)

    def done(self) -> None:
        """The runner ended the tree and released the lease itself: the guard may exit."""
        if self._control is not None:
            try:
                os.write(self._control, _DONE)
            except OSError:  # the guard died: nothing to tell, the runner ended the tree itself
                log.debug("guard %d is gone", self.pid)
            os.close(self._control)
            self._control = None

    def abort(self) -> None:
        """End whatever the guard started (as if the runner had died), wait until it has, and
        remove the lease's cgroup."""
        if self._control is not None:
            os.close(self._control)
            self._control = None
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.end_cgroup()

    def collect(self, timeout_s: float = 1.0) -> None:
        """Reap the guard, which exits at once after `done`: no process of the run outlives the
        runner. Waits at most `timeout_s` (a guard that hangs must not hold the runner)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0] or time.monotonic() > deadline:
                    return
            except ChildProcessError:
                return
            time.sleep(0.0005)


def _serve(
    control_fd: int,
    report_fd: int,
    lease_id: str,
    grace_s: float,
    command: Sequence[str],
    env: Mapping[str, str],
    workdir: Optional[Path],
    cgroup: Optional[LeaseCgroup],
) -> None:
    """The guard's whole life, in the forked process; always leaves with os._exit."""
    try:
        os.setpgid(0, 0)  # out of the runner's group: a Ctrl-C to it must not reach the guard
        become_subreaper()
        # First: the runner waits for it (the child gets stdin, stdout and stderr only).
        child = _start(command, env, report_fd, cgroup)
        _close_all_but({control_fd, report_fd})  # the runner's pipes, sockets, the DB; stdio just below
        if child is None:
            if cgroup is not None:
                cgroup.remove()
            return
        for signum in _IGNORED:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
        runner_died, reaped = _relay(control_fd, report_fd, child.pid)
        if runner_died:
            _end_lease(lease_id, child.pid, reaped, grace_s, cgroup, workdir)
        reap_all()
    finally:
        os._exit(0)  # no atexit, no finalizers of the runner's copied state


def _start(
    command: Sequence[str], env: Mapping[str, str], report_fd: int, cgroup: Optional[LeaseCgroup]
) -> Optional[Started]:
    """Start the command as the guard's child, inside `cgroup` where there is one; report its pid,
    or why it could not start, to the runner."""
    # The command must see the forwarded signals as a command run directly does: default action,
    # not blocked (exec keeps a blocked mask and ignored signals).
    for signum in _IGNORED:
        signal.signal(signum, signal.SIG_DFL)
    arm = parent_death_signal()  # the guard is the parent now: it dies last

    def setup() -> None:  # between fork and exec: no imports, no locks
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
        if arm is not None:
            arm()

    try:
        if cgroup is None:
            child: Started = start(command, env, setup)
        else:
            from .spawn import start_in_cgroup  # ctypes' clone3: only where there is a cgroup to start in

            child = start_in_cgroup(command, env, cgroup, setup)
    except (InvalidInput, GpupoolError) as err:
        _say(report_fd, (_INVALID if isinstance(err, InvalidInput) else _FAILED) + _one_line(err.message))
        return None
    except Exception as err:  # out of processes, a preexec failure: the runner says why
        _say(report_fd, _FAILED + _one_line(repr(err)))
        return None
    _say(report_fd, _PID + str(child.pid).encode())
    return child  # kept referenced: a collected Popen could reap the command behind our back


def _relay(control_fd: int, report_fd: int, main: int) -> Tuple[bool, bool]:
    """Reap children and relay the command's exit status until the runner says "done" or dies.

    Returns (the runner died, the command was reaped).
    """
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, _ignore)  # a Python handler, so the wakeup fd hears SIGCHLD
    report: Optional[int] = report_fd
    reaped = False
    pending = b""
    while True:
        for pid, status in reap_all():
            if pid == main and report is not None:
                reaped = True
                _say(report, _EXIT + str(os.waitstatus_to_exitcode(status)).encode())
                os.close(report)  # the runner's wait() sees EOF after the status, never blocks
                report = None
        ready = select.select([control_fd, wake_r], [], [])[0]
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        if control_fd in ready:
            data = os.read(control_fd, 64)
            if not data:
                return True, reaped
            pending += data
            if _DONE in pending:
                return False, reaped


def _end_lease(
    lease_id: str, main: int, reaped: bool, grace_s: float, cgroup: Optional[LeaseCgroup], workdir: Optional[Path]
) -> None:
    """The runner is gone: end every process of the lease and remove the run's folder."""
    if not reaped:  # at once, as the kernel's parent-death signal did when the runner was the parent
        try:
            os.kill(main, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if cgroup is not None:
        cgroup.kill()
    # The guard's descendants (every orphan of the tree), the command's group, the lease's env.
    end_tree(main, grace_s, lease_id=lease_id)
    if cgroup is not None:
        cgroup.remove()
    if workdir is not None:
        remove_tree(workdir)


def _close_all_but(keep: Set[int]) -> None:
    """Close every inherited fd (pipes of whoever waits for the runner's output, sockets, the DB)
    but `keep`; /dev/null in place of stdin, stdout and stderr."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep and fd > 2:
            try:
                os.close(fd)
            except OSError:  # the listing's own fd, already closed
                pass
    _detach_stdio()


def _detach_stdio() -> None:
    """/dev/null in place of the runner's stdin, stdout and stderr, which the command has now."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in (0, 1, 2):
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    if null > 2:
        os.close(null)


def _say(fd: int, line: bytes) -> None:
    try:
        os.write(fd, line + b"\n")
    except OSError:  # the runner is gone: the EOF on the control pipe tells the guard so
        pass


def _one_line(text: str) -> bytes:
    return " ".join(text.split()).encode("utf-8", "replace")


def _ignore(signum: int, frame: object) -> None:
    """SIGCHLD's handler: nothing to do, the wakeup fd does the work."""
