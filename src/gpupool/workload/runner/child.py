"""Start the workload in its own process group, forward signals to it, and map its exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import FrameType
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput
from ...logs import get_logger

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

    # What signal.signal takes and returns (typeshed's private signal._HANDLER).
    SignalHandler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]

    from .guard import GuardedChild

    # The command: started by the runner itself, or by its guard.
    Child = Union[subprocess.Popen[bytes], GuardedChild]

log = get_logger(__name__)

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# After this many forwarded signals the child is killed: the user means it.
KILL_AFTER = 3


class Interrupted(Exception):
    """A forwarded signal arrived before there was a child to forward it to."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum


def exit_code(returncode: int) -> int:
    """The shell convention: 128+N when the child died of signal N (Popen's -N).

    The one mapping: `gpupool run` exits with it and the job supervisor records replicas' with it.
    """
    return 128 - returncode if returncode < 0 else returncode


class SignalRelay:
    """Forwards SIGINT/SIGTERM/SIGHUP to the child's process group while installed.

    Before the child starts, a signal raises `Interrupted` so the runner's
    `finally` releases whatever it claimed.
    """

    def __init__(self) -> None:
        self.child: Optional[Child] = None
        self.received: List[int] = []
        self._previous: Dict[int, SignalHandler] = {}

    def install(self) -> SignalRelay:
        for signum in FORWARDED:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def resume(self) -> None:
        """Forward signals again after `quiet` (the next attempt of a requeued command)."""
        self.received.clear()
        for signum in FORWARDED:
            signal.signal(signum, self._handle)

    def quiet(self) -> None:
        """Record but ignore signals (while releasing: finish the release first)."""
        self.child = None
        for signum in FORWARDED:
            signal.signal(signum, lambda s, f: self.received.append(s))

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        child = self.child
        if child is None:
            raise Interrupted(signum)
        if child.poll() is not None:
            return
        sig = signal.SIGKILL if len(self.received) >= KILL_AFTER else signum
        # A tree stopped while its lease is suspended would keep a SIGTERM or SIGHUP pending, and
        # the runner would wait for it for ever: continue it, so the signal acts now.
        for each in (sig, signal.SIGCONT) if sig in (signal.SIGTERM, signal.SIGHUP) else (sig,):
            try:
                os.killpg(child.pid, each)
            except ProcessLookupError:
                pass
            except PermissionError:  # the group is gone and its id reused: signal the child only
                child.send_signal(each)


def start(
    command: Sequence[str], env: Mapping[str, str], preexec: Optional[Callable[[], None]] = None
) -> subprocess.Popen[bytes]:
    """Start `command` as the leader of a new process group (so signals reach its whole tree);
    `preexec` runs in the child between fork and exec (the parent-death signal)."""
    argv, child_env = list(command), dict(env)
    try:
        if sys.version_info >= (3, 11):
            # preexec_fn=None is Popen's default: no hook between fork and exec.
            return subprocess.Popen(argv, env=child_env, process_group=0, preexec_fn=preexec)
        else:  # pragma: no cover - exercised on 3.9/3.10 only

            def setup() -> None:
                os.setpgrp()
                if preexec is not None:
                    preexec()

            return subprocess.Popen(argv, env=child_env, preexec_fn=setup)
    except OSError as err:
        raise not_startable(command, err) from None


def not_startable(command: Sequence[str], err: OSError) -> Exception:
    """What to raise when exec of `command` failed with `err`: InvalidInput, naming the fix, for
    a command that is not there or not executable; `err` itself otherwise."""
    if isinstance(err, FileNotFoundError):
        return InvalidInput(f"command {command[0]!r} was not found: check the name or give a full path")
    if isinstance(err, PermissionError):
        return InvalidInput(f"command {command[0]!r} is not executable: check its permissions")
    return err


class Terminal:
    """Hands the controlling terminal's foreground to the child, so Ctrl-C, Ctrl-\\ and reads from
    the terminal reach it as if it ran directly; gives it back afterwards."""

    def __init__(self) -> None:
        self._fd: Optional[int] = None

    def give(self, pgid: int) -> None:
        try:
            fd = sys.stdin.fileno()
            if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
                return  # not interactive, or we are a background job ourselves
            with _ignored(signal.SIGTTOU):
                os.tcsetpgrp(fd, pgid)
            self._fd = fd
        except (OSError, ValueError, AttributeError):
            self._fd = None

    def take_back(self) -> None:
        if self._fd is None:
            return
        try:
            with _ignored(signal.SIGTTOU):
                os.tcsetpgrp(self._fd, os.getpgrp())
        except OSError:
            pass
        self._fd = None


class _ignored:
    """Ignore one signal inside a with-block (tcsetpgrp from a background group raises SIGTTOU)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.previous: SignalHandler = None

    def __enter__(self) -> None:
        self.previous = signal.signal(self.signum, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        signal.signal(self.signum, self.previous)
