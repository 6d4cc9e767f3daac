"""Start the command inside the lease's cgroup from its first instruction (Linux, stdlib only).

A process moved into a cgroup after it started has had time to fork out of reach (a daemon that
forks a successor every half millisecond is never listed in time), so the guard's child is born
in the cgroup: `clone3(CLONE_INTO_CGROUP)` (Linux >= 5.7), which takes no lock that others wait
on. Where clone3 is refused (an older kernel, a seccomp filter that answers ENOSYS, a v1
hierarchy, which clone3 cannot name) the child writes itself into the cgroup's `cgroup.procs`
between fork and exec instead: the same place, one RCU grace period slower (~15 ms), paid only
there. Either way the child then does what `subprocess.Popen(process_group=0, preexec_fn=setup)`
does, and exec errors come back as the same exceptions.

The clone3 child runs a few lines of Python between clone and exec without the interpreter's
after-fork bookkeeping, as a `preexec_fn` does: safe only in a process with no other thread (the
guard, which starts no thread before the command), and it imports nothing there.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
from typing import TYPE_CHECKING, NamedTuple

from ...core.errors import GpupoolError
from ...pooling.isolation.env import LEASE_CGROUP_ENV
from .child import not_startable, start

if TYPE_CHECKING:
    from typing import Callable, List, Mapping, Optional, Sequence, Union

    from ...pooling.isolation.cgroup import LeaseCgroup

# The syscall's number is the same on every Linux architecture gpupool runs on (x86_64, aarch64).
SYS_CLONE3 = 435
CLONE_INTO_CGROUP = 0x200000000
# What makes clone3 into a cgroup unusable here, and the write into cgroup.procs the way in.
_NO_CLONE3 = {errno.ENOSYS, errno.E2BIG, errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP, errno.EBADF, errno.EBUSY}
# What Python ignores at start and Popen(restore_signals=True) gives the command back.
_RESTORED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name))
# The child's word to its parent when exec failed: errno, then _exit with this status.
_EXEC_FAILED = 127


class _CloneArgs(ctypes.Structure):
    """struct clone_args up to `cgroup` (CLONE_ARGS_SIZE_VER2, 88 bytes)."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "flags",
            "pidfd",
            "child_tid",
            "parent_tid",
            "exit_signal",
            "stack",
            "stack_size",
            "tls",
            "set_tid",
            "set_tid_size",
            "cgroup",
        )
    ]


class Born(NamedTuple):
    """A command started by clone3: its pid (the guard reaps it with waitpid, as any child)."""

    pid: int


def start_in_cgroup(
    command: Sequence[str], env: Mapping[str, str], cgroup: LeaseCgroup, setup: Optional[Callable[[], None]] = None
) -> Union[subprocess.Popen[bytes], Born]:
    """Start `command` as the leader of a new process group, a member of `cgroup` before its
    first instruction; `setup` runs in the child just before exec. Returns what has its `.pid`
    (a Born, or the fallback's Popen, to be kept referenced). InvalidInput when the command is not
    found or not executable, as `child.start` says it."""
    born = None if cgroup.v1 else _clone_into(command, env, cgroup.path, setup)  # clone3 names v2 cgroups only
    if born is not None:
        return born
    fd = os.open(os.path.join(cgroup.path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)

    def join_then_setup() -> None:  # between fork and exec: "0" is the writer itself
        os.write(fd, b"0")
        if setup is not None:
            setup()

    try:
        return start(command, env, join_then_setup)
    except subprocess.SubprocessError as err:  # the write failed: never run it outside the cgroup
        raise GpupoolError(
            f"the lease's cgroup {cgroup.path} refused it ({err}); set {LEASE_CGROUP_ENV}=off to run without one"
        ) from None
    finally:
        os.close(fd)


def _clone_into(
    command: Sequence[str], env: Mapping[str, str], cgroup_path: str, setup: Optional[Callable[[], None]]
) -> Optional[Born]:
    """clone3 into the cgroup and exec; None where clone3 cannot do it here (nothing started)."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL stays held across the clone
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_size_t]
    argv = [os.fsencode(arg) for arg in command]
    paths = _candidates(argv[0], env)
    child_env = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    try:
        cgroup_fd = os.open(cgroup_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    _no_inheritance()  # Popen's close_fds: exec closes whatever the guard holds
    err_r, err_w = os.pipe()  # close-on-exec: EOF once the exec succeeded
    try:
        args = _CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=int(signal.SIGCHLD), cgroup=cgroup_fd)
        pid = syscall(SYS_CLONE3, ctypes.byref(args), ctypes.sizeof(args))
        if pid == 0:
            _exec(argv, paths, child_env, setup, err_w)  # never returns
        failure = ctypes.get_errno()
    finally:
        os.close(err_w)
        os.close(cgroup_fd)
    try:
        if pid < 0:
            if failure in _NO_CLONE3:
                return None
            raise OSError(failure, os.strerror(failure))  # out of processes, as fork would be
        report = b""
        while True:
            data = os.read(err_r, 64)
            if not data:
                break
            report += data
    finally:
        os.close(err_r)
    if report:
        os.waitpid(pid, 0)  # the child that could not exec: collected here, not by the guard's relay
        raise not_startable(command, _exec_error(int(report) if report.isdigit() else 0, command[0]))
    return Born(pid)


def _exec(
    argv: List[bytes],
    paths: List[bytes],
    env: Mapping[bytes, bytes],
    setup: Optional[Callable[[], None]],
    err_w: int,
) -> None:
    """In the cloned child: Popen's child steps (own group, restored signals, `setup`), then exec
    the first path that runs; its errno to the parent otherwise."""
    code = 0
    try:
        os.setpgid(0, 0)
        for signum in _RESTORED:
            signal.signal(signum, signal.SIG_DFL)
        if setup is not None:
            setup()
        for path in paths:
            try:
                os.execve(path, argv, env)
            except OSError as err:  # Popen's rule: the first error that is not "no such file"
                if not code or code in (errno.ENOENT, errno.ENOTDIR):
                    code = err.errno or 0
        os.write(err_w, str(code).encode())
    except BaseException:  # setup failed: the parent hears "0", never a traceback
        pass
    finally:
        os._exit(_EXEC_FAILED)


def _candidates(program: bytes, env: Mapping[str, str]) -> List[bytes]:
    """Where exec looks for `program`: itself when it names a folder, else each PATH entry (the
    command's own PATH, as Popen looks)."""
    if os.path.dirname(program):
        return [program]
    return [os.path.join(os.fsencode(folder), program) for folder in os.get_exec_path(dict(env))]


def _no_inheritance() -> None:
    """Make every inheritable fd above stderr close-on-exec (what the runner inherited from its
    own parent): the command gets stdin, stdout and stderr only, as with Popen's close_fds."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)
            except OSError:  # the listing's own fd, closed already
                pass


def _exec_error(code: int, program: str) -> OSError:
    """The OSError Popen raises for exec's errno `code` (0: the set-up before exec failed)."""
    if not code:
        return OSError(f"the set-up of {program!r} failed before exec")
    return OSError(code, os.strerror(code), program)  # FileNotFoundError for ENOENT, and so on
