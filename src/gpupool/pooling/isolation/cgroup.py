"""One cgroup per lease, below the runner's own (stdlib only): what the kernel counts as the
lease's processes, whatever they do to their env, session, parent or name, and ends at once.

The runner creates `gpupool-<lease id>-<runner pid>` and the guard starts the command inside it
(`runner/spawn.py`: born there by clone3, or joined between fork and exec), so every process the
command ever forks is a member from its first instruction: a daemon that forks a successor every
half millisecond has no moment outside it. The end of the lease (the command's exit, a lost,
released or preempted lease, the runner's kill -9 seen by the guard) freezes the cgroup, so
nothing in it forks while it is signalled, then SIGTERMs (`terminate`) or SIGKILLs (`kill`:
`cgroup.kill`, Linux >= 5.14, else each member) every member, thaws it, waits it empty and
removes it.

cgroup v2 first (`cgroup.freeze`, `cgroup.events`); where it is not writable, the cgroup v1
freezer hierarchy (`freezer.state`; a frozen v1 member dies of SIGKILL only once thawed, so each
round is freeze, SIGKILL each, thaw). Where neither is writable (most containers, a user's
systemd session) or `GPUPOOL_LEASE_CGROUP=off`, `LeaseCgroup.create` says None and the runner's
guard, the command's subreaper, ends the tree alone by walking it: a process that re-forks faster
than a walk of /proc outruns that.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from .env import LEASE_CGROUP_ENV

if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Tuple

# The value of LEASE_CGROUP_ENV that keeps a lease out of a cgroup of its own, and the one that
# takes the cgroup v1 freezer even where cgroup v2 is writable (what a v1-only host gets anyway).
OFF = "off"
V1 = "v1"
NAME_PREFIX = "gpupool-"
# After cgroup.kill the kernel still tears the processes down; wait at most this long for empty.
KILL_SETTLE_S = 2.0
# A freeze completes once every member has stopped at its next kernel exit; a member stuck in the
# kernel (uninterruptible I/O) delays it: signal the members after at most this long regardless.
FREEZE_SETTLE_S = 0.5
_POLL_S = 0.002
# While waiting for an empty cgroup, kill again every this many polls.
_REKILL_EVERY = 10


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> Optional[Tuple[str, str]]:
    """(mount point, the hierarchy's path mounted there) of the cgroup2 file system, or None.

    /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a hybrid one; a container with its
    own cgroup namespace mounts its root as "/".
    """
    return _mount(mountinfo, "cgroup2")


def freezer_mount(mountinfo: str = "/proc/self/mountinfo") -> Optional[Tuple[str, str]]:
    """(mount point, path mounted there) of the cgroup v1 hierarchy with the freezer, or None."""
    return _mount(mountinfo, "cgroup", "freezer")


def _mount(mountinfo: str, fstype: str, option: str = "") -> Optional[Tuple[str, str]]:
    try:
        with open(mountinfo, errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        # "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER"
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not (sep and after[:1] == [fstype] and len(fields) >= 5):
            continue
        if option and option not in (after[2] if len(after) > 2 else "").split(","):
            continue
        return _unescape(fields[4]), _unescape(fields[3])
    return None


def own_cgroup(proc_cgroup: str = "/proc/self/cgroup", controller: str = "") -> Optional[str]:
    """This process's cgroup v2 path (the '0::' line), or with `controller` its path in the v1
    hierarchy of that controller; None where there is none (or it was deleted)."""
    try:
        with open(proc_cgroup, errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        # "ID:CONTROLLERS:PATH"; the v2 line is "0::PATH"
        ident, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        mine = controller in controllers.split(",") if controller else (ident == "0" and not controllers)
        if mine and path.startswith("/"):
            return None if path.endswith(" (deleted)") else path
    return None


def lease_cgroup_parent(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The folder a lease cgroup v2 is made in (this process's own cgroup), or None where there is
    none to make: no cgroup v2, not writable by this user, or LEASE_CGROUP_ENV=off or v1."""
    if _setting(environ) in (OFF, V1):
        return None
    return _writable_folder(cgroup2_mount(), own_cgroup())


def freezer_parent(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The folder a lease cgroup is made in in the v1 freezer hierarchy (this process's own
    there), or None: no such hierarchy, not writable, or LEASE_CGROUP_ENV=off."""
    if _setting(environ) == OFF:
        return None
    return _writable_folder(freezer_mount(), own_cgroup(controller="freezer"))


def _setting(environ: Optional[Mapping[str, str]]) -> str:
    env = os.environ if environ is None else environ
    return env.get(LEASE_CGROUP_ENV, "").strip().lower()


def _writable_folder(mount: Optional[Tuple[str, str]], path: Optional[str]) -> Optional[str]:
    """Our cgroup's folder under `mount`, where we may make a cgroup and move a process into it."""
    if mount is None or path is None:
        return None
    point, root = mount
    if root != "/" and not (path == root or path.startswith(root + "/")):
        return None  # our cgroup is outside what is mounted here
    relative = path[len(root) :] if root != "/" else path
    folder = point.rstrip("/") + relative.rstrip("/") if relative != "/" else point
    # Moving a process needs write access to cgroup.procs of the common ancestor: our own cgroup.
    if not (os.access(folder, os.W_OK | os.X_OK) and os.access(os.path.join(folder, "cgroup.procs"), os.W_OK)):
        return None
    return folder


class LeaseCgroup:
    """A lease's cgroup folder (v2, or the v1 freezer's): list its processes, end them, remove it
    (the guard starts the command in it: `runner/spawn.py`)."""

    def __init__(self, path: str, v1: bool = False) -> None:
        self.path = path
        self.v1 = v1

    @classmethod
    def create(cls, lease_id: str, environ: Optional[Mapping[str, str]] = None) -> Optional[LeaseCgroup]:
        """Make the cgroup of `lease_id` below this process's own (v2, else the v1 freezer's);
        None where that cannot be done."""
        parent, v1 = lease_cgroup_parent(environ), False
        if parent is None:
            parent, v1 = freezer_parent(environ), True
        if parent is None:
            return None
        safe = "".join(ch for ch in lease_id if ch.isalnum() or ch in "-_")[:32]
        path = os.path.join(parent, f"{NAME_PREFIX}{safe}-{os.getpid()}")
        try:
            os.mkdir(path)
        except OSError:  # a read-only mount despite the mode bits, a limit on descendants
            return None
        if not os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
            cls(path, v1).remove()
            return None
        return cls(path, v1)

    def pids(self) -> List[int]:
        """The processes in the cgroup now ([] once it is gone)."""
        try:
            with open(os.path.join(self.path, "cgroup.procs"), "rb") as handle:
                return [int(x) for x in handle.read().split()]
        except (OSError, ValueError):
            return []

    def populated(self) -> bool:
        """Whether any live process is in the cgroup (zombies do not count; gone counts as empty)."""
        if self.v1:  # no cgroup.events; cgroup.procs lists no zombie
            return bool(self.pids())
        try:
            with open(os.path.join(self.path, "cgroup.events"), "rb") as handle:
                return b"populated 1" in handle.read()
        except OSError:
            return False

    def terminate(self, grace_s: float, settle_s: float = KILL_SETTLE_S) -> bool:
        """SIGTERM every member at once, SIGKILL what is left after `grace_s`; returns whether the
        cgroup is empty. Frozen while it is listed and signalled: no member forks past it."""
        if not self.populated():
            return True
        frozen = self._freeze()
        try:
            self._signal_each(signal.SIGTERM)
            self._signal_each(signal.SIGCONT)  # a stopped member sees its SIGTERM now, once thawed
        finally:
            if frozen:
                self._thaw()
        deadline = time.monotonic() + max(grace_s, 0.0)
        while self.populated() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        return self.kill(settle_s)

    def kill(self, settle_s: float = KILL_SETTLE_S, kill_file: bool = True) -> bool:
        """Freeze the cgroup, SIGKILL every member, thaw it and wait until it is empty; returns
        whether it is.

        `kill_file=False` does what a kernel without cgroup.kill (and the v1 freezer) gets:
        rounds of freeze, SIGKILL to each member listed, thaw (a frozen v1 member dies only
        once thawed), until none is left.
        """
        if not self.populated():  # nothing to kill: no write at all (the common case, at every run's end)
            return True
        deadline = time.monotonic() + settle_s
        if kill_file and not self.v1:
            frozen = self._write("cgroup.freeze", b"1")  # nothing forks from here on
            try:
                if self._write("cgroup.kill", b"1"):  # the kernel's kill: atomic against forks too
                    rounds = 0
                    while self.populated():
                        if time.monotonic() > deadline:
                            return False
                        rounds += 1
                        if rounds % _REKILL_EVERY == 0:  # a process moved in after the kill
                            self._write("cgroup.kill", b"1")
                        time.sleep(_POLL_S)
                    return True
            finally:
                if frozen:
                    self._thaw()
        while True:
            frozen = self._freeze()
            try:
                self._signal_each(signal.SIGKILL)
            finally:
                if frozen:
                    self._thaw()
            if not self.populated():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_S)

    def remove(self, settle_s: float = KILL_SETTLE_S) -> bool:
        """Kill what is left and remove the cgroup folder; returns whether it is gone."""
        deadline = time.monotonic() + settle_s
        while True:
            self.kill(max(0.0, deadline - time.monotonic()))
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:  # EBUSY: a member left to go, or one moved in since the kill
                if time.monotonic() > deadline:
                    return False
                time.sleep(_POLL_S)

    def _freeze(self) -> bool:
        """Freeze the cgroup and wait (FREEZE_SETTLE_S at most) until it is; returns whether the
        kernel took the freeze (v2: Linux >= 5.2), to be thawed by the caller."""
        if not (self._write("freezer.state", b"FROZEN") if self.v1 else self._write("cgroup.freeze", b"1")):
            return False
        deadline = time.monotonic() + FREEZE_SETTLE_S
        while not self._frozen() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        return True

    def _thaw(self) -> None:
        if self.v1:
            self._write("freezer.state", b"THAWED")
        else:
            self._write("cgroup.freeze", b"0")

    def _frozen(self) -> bool:
        """Whether every member is frozen now (True once the cgroup is gone: nothing to wait for)."""
        name, word = ("freezer.state", b"FROZEN") if self.v1 else ("cgroup.events", b"frozen 1")
        try:
            with open(os.path.join(self.path, name), "rb") as handle:
                return word in handle.read()
        except OSError:
            return True

    def _signal_each(self, signum: int) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _write(self, name: str, value: bytes) -> bool:
        try:
            fd = os.open(os.path.join(self.path, name), os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            os.write(fd, value)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)


def _unescape(field: str) -> str:
    r"""A mountinfo path with its octal escapes (\040 for a space ...) decoded."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)
