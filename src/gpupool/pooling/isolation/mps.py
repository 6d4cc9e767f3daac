"""Supervision of one NVIDIA CUDA MPS control daemon per pool state dir (stdlib only).

In `mps` isolation the driver itself holds each client to its share: the MPS
server caps a client's device memory at CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and its
SMs at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, both read from the client's env
(isolation/env.py). This module only keeps the control daemon running, with its
pipe and log folders under the pool's state dir:

- `MpsDaemon` (the server and the node agent): `nvidia-cuda-mps-control -f` as a
  supervised child, restarted with backoff if it dies, quit through the control
  interface by `stop()`. A server killed with kill -9 leaves its daemon serving its
  clients (the daemon has its own session); the next server on the state dir adopts
  that one (named with its start time in STATE/mps/control.pid) instead of refusing
  to start.
- `ensure_detached` (`gpupool run` on the embedded pool, which has no long-lived
  process): `nvidia-cuda-mps-control -d` unless a daemon already answers on the
  pipe folder. That daemon stays as pool infrastructure after the run ends;
  `stop_detached` (or `echo quit | CUDA_MPS_PIPE_DIRECTORY=STATE/mps/pipe
  nvidia-cuda-mps-control`) ends it.

No default limits are set on the daemon (`set_default_device_pinned_mem_limit`,
`set_default_active_thread_percentage`): every lease has its own share, which
its client's env carries.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import InvalidInput, Unavailable
from ...core.isolation_mode import MPS_DIR, IsolationMode, NodeIsolation
from ...logs import get_logger
from .env import MPS_LOG_ENV, MPS_PIPE_ENV
from .evidence import start_ticks
from .proctree import alive, stat_fields

if TYPE_CHECKING:
    from typing import Dict, Mapping, Optional, Tuple, Union

log = get_logger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
# A control command that changes nothing; the NVIDIA device plugin probes health with it too.
PROBE_COMMAND = "get_default_active_thread_percentage"
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# A daemon that ran this long before dying starts the backoff afresh.
HEALTHY_RUN_S = 60.0
# The running daemon's pid and start time, in STATE/mps: what the next server on the state dir adopts.
PID_FILE = "control.pid"
# How often an adopted daemon (not our child, so not one to wait() for) is checked for its end.
ADOPTED_POLL_S = 0.2


class MpsUnavailable(InvalidInput):
    """`--isolation mps` on a machine without the MPS control binary."""

    code = "mps_unavailable"


def mps_dirs(state_dir: Path) -> Tuple[Path, Path]:
    """The pipe and log folders of the pool's MPS daemon: STATE/mps/pipe and STATE/mps/log."""
    root = Path(state_dir) / MPS_DIR
    return root / "pipe", root / "log"


def find_binary(binary: str = MPS_CONTROL) -> str:
    """The control binary's path; raises MpsUnavailable, with the fix, when it is not on PATH."""
    found = shutil.which(binary)
    if found is None:
        raise MpsUnavailable(
            f"--isolation mps needs {binary!r}, which is not on PATH: install the NVIDIA driver "
            f"utilities (e.g. the nvidia-compute-utils package) or use --isolation hooks"
        )
    return found


def control_env(pipe_dir: Path, log_dir: Path, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The env of the daemon and of control commands: the pool's folders, all GPUs visible."""
    env = dict(os.environ if base is None else base)
    # With CUDA_VISIBLE_DEVICES set, the MPS server renumbers devices and clients
    # that name them by UUID would fail; the pool's daemon serves every GPU.
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env[MPS_PIPE_ENV] = str(pipe_dir)
    env[MPS_LOG_ENV] = str(log_dir)
    return env


def control(command: str, pipe_dir: Path, log_dir: Path, binary: str = MPS_CONTROL, timeout_s: float = 10.0) -> str:
    """Send one command to the daemon on `pipe_dir` (`echo COMMAND | nvidia-cuda-mps-control`); its answer.

    Raises Unavailable when no daemon answers there.
    """
    try:
        done = subprocess.run(
            [find_binary(binary)],
            input=command + "\n",
            env=control_env(pipe_dir, log_dir),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(
            f"the MPS control daemon on {pipe_dir} did not answer {command!r} in "
            f"{timeout_s:g} s: see {log_dir}/control.log"
        ) from None
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()
        raise Unavailable(
            f"no MPS control daemon answers on {pipe_dir} ({reason[-1] if reason else done.returncode}): "
            f"start the pool with --isolation mps, or see {log_dir}/control.log"
        )
    return done.stdout.strip()


def answers(pipe_dir: Path, log_dir: Path, binary: str = MPS_CONTROL, timeout_s: float = 5.0) -> bool:
    """Whether a control daemon answers on `pipe_dir`."""
    # An empty or missing folder has no daemon: skip starting a client process.
    if not Path(pipe_dir).is_dir() or not any(Path(pipe_dir).iterdir()):
        return False
    try:
        control(PROBE_COMMAND, pipe_dir, log_dir, binary, timeout_s)
    except Unavailable:
        return False
    return True


class _Adopted:
    """A daemon that an earlier process of the state dir started (not our child), with the part of
    Popen's interface MpsDaemon uses; its end is polled, as only its own parent can wait for it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> Optional[int]:
        return None if alive(self.pid) else -1  # its exit status went to its parent

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while alive(self.pid):
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(ADOPTED_POLL_S)
        return -1

    def terminate(self) -> None:
        _signal(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        _signal(self.pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class MpsDaemon:
    """One `nvidia-cuda-mps-control -f` for a pool state dir, restarted with backoff until `stop()`."""

    def __init__(self, state_dir: Path, binary: str = MPS_CONTROL, ready_s: float = 10.0, quit_s: float = 10.0) -> None:
        self.pipe_dir, self.log_dir = mps_dirs(state_dir)
        self.binary = binary
        self.ready_s = ready_s
        self.quit_s = quit_s
        self.restarts = 0
        self.pid_file = self.pipe_dir.parent / PID_FILE
        self.adopted = False  # start() found the daemon of an earlier server of the state dir serving
        self._proc: Optional[Union[subprocess.Popen[bytes], _Adopted]] = None
        self._identity: Optional[Tuple[int, int]] = None  # the daemon's (pid, start ticks), as recorded
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def isolation(self) -> NodeIsolation:
        return NodeIsolation(IsolationMode.MPS, str(self.pipe_dir), str(self.log_dir))

    @property
    def pid(self) -> Optional[int]:
        """The running daemon's pid (None when none runs)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def identity(self) -> Optional[Tuple[int, int]]:
        """The current daemon's pid and start time (clock ticks since boot), as started or adopted;
        None before start and after stop. Its descendants (the MPS servers) are the node's own
        processes (enforcement/attribution.py); a dead daemon's pid, reused, has another start time."""
        return self._identity

    def start(self) -> NodeIsolation:
        """Start the daemon and its supervisor; returns the node's isolation. Idempotent while running.

        Raises MpsUnavailable without the binary, Unavailable when the daemon does not come up
        or another daemon already serves the folder.
        """
        with self._lock:
            if self._thread is not None:
                return self.isolation
            path = find_binary(self.binary)
            self.pipe_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            serving = answers(self.pipe_dir, self.log_dir, path)
            earlier = self._earlier_daemon() if serving else None
            if serving and earlier is None:
                raise Unavailable(
                    f"an MPS control daemon already answers on {self.pipe_dir} (one `gpupool run` "
                    f"started for the embedded pool?): stop it with `echo quit | "
                    f"{MPS_PIPE_ENV}={self.pipe_dir} {self.binary}` and start again"
                )
            self._stopping.clear()
            spawned: Optional[subprocess.Popen[bytes]] = None
            if earlier is not None:
                # The daemon of an earlier server of this state dir (killed without its stop()), still
                # serving its clients: adopted, not replaced under them.
                proc: Union[subprocess.Popen[bytes], _Adopted] = earlier
                self._proc, self.adopted = earlier, True
            else:
                proc = self._proc = spawned = self._spawn(path)
        if spawned is not None:
            try:
                self._wait_ready(spawned)
            except BaseException:
                self.stop()
                raise
        thread = threading.Thread(target=self._supervise, args=(path,), name="mps-control", daemon=True)
        with self._lock:
            self._thread = thread
        thread.start()
        how = "adopted, already serving" if self.adopted else "serving"
        log.info("MPS control daemon %d %s %s", proc.pid, how, self.pipe_dir)
        return self.isolation

    def _earlier_daemon(self) -> Optional[_Adopted]:
        """The daemon PID_FILE names, if that very process still runs as the leader of its own group
        and the process that supervised it has ended: one an earlier server of this state dir
        started (or adopted) and left. A pid is matched with its start time, so that a later
        process reusing the pid is never taken for it."""
        try:
            pid, started, supervisor, supervisor_started = (int(v) for v in self.pid_file.read_text().split())
        except (OSError, ValueError):
            return None
        fields = stat_fields(pid)
        if fields is None or start_ticks(pid) != started or fields[2] != str(pid) or not alive(pid):
            return None
        if alive(supervisor) and start_ticks(supervisor) == supervisor_started:
            return None  # still supervised (another MpsDaemon on the folder): not ours to take
        self._record(pid)  # and its identity, for attribution
        return _Adopted(pid)

    def _record(self, pid: int) -> None:
        """Write PID_FILE: the daemon and its supervisor (this process), each with its start time."""
        started, ours = start_ticks(pid), start_ticks(os.getpid())
        self._identity = None if started is None else (pid, started)
        if started is None or ours is None:
            return
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(f"{pid} {started} {os.getpid()} {ours}\n")
        os.replace(tmp, self.pid_file)

    def _spawn(self, path: str) -> subprocess.Popen[bytes]:
        # Its own session: the MPS servers it starts go in its process group, which
        # stop() can end as a whole, and a terminal's Ctrl-C does not reach it.
        with open(self.log_dir / "control-foreground.log", "ab") as out:
            proc = subprocess.Popen(
                [path, "-f"],
                env=control_env(self.pipe_dir, self.log_dir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        self._record(proc.pid)  # what the next server adopts if this one is killed without stop()
        return proc

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.ready_s
        while True:
            code = proc.poll()
            if code is not None:
                raise Unavailable(
                    f"{self.binary} -f exited with {code} at start: see "
                    f"{self.log_dir}/control.log and control-foreground.log, "
                    f"or use --isolation hooks"
                )
            if answers(self.pipe_dir, self.log_dir, self.binary, timeout_s=2.0):
                return
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"{self.binary} -f did not answer on {self.pipe_dir} within "
                    f"{self.ready_s:g} s: see {self.log_dir}/control.log"
                )
            time.sleep(0.05)

    def _supervise(self, path: str) -> None:
        backoff = BACKOFF_START_S
        started = time.monotonic()
        while not self._stopping.is_set():
            proc = self._proc
            if proc is None:
                return
            try:
                code = proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            self.adopted = False  # what is started next is our own child
            if self._stopping.is_set():
                return
            if time.monotonic() - started >= HEALTHY_RUN_S:
                backoff = BACKOFF_START_S
            log.warning("MPS control daemon %d exited with %s; restarting in %.1f s", proc.pid, code, backoff)
            _kill_group(proc.pid)  # its MPS servers would hold the pipe folder
            if self._stopping.wait(backoff):
                return
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    new = self._proc = self._spawn(path)
                except OSError as err:
                    log.error("MPS control daemon could not be restarted: %s", err)
                    continue
                self.restarts += 1
                started = time.monotonic()
            log.info("MPS control daemon restarted as %d", new.pid)

    def stop(self) -> None:
        """Quit the daemon through its control interface, then terminate/kill what is left. Idempotent."""
        with self._lock:
            self._stopping.set()
            proc, thread = self._proc, self._thread
            self._thread = None
        if thread is not None:
            thread.join()
        if proc is None:
            return
        if proc.poll() is None:
            try:
                control("quit", self.pipe_dir, self.log_dir, self.binary, timeout_s=self.quit_s)
            except (Unavailable, MpsUnavailable) as err:
                log.warning("MPS control daemon %d did not take quit: %s", proc.pid, err.message)
            try:
                proc.wait(timeout=self.quit_s)
            except subprocess.TimeoutExpired:
                log.warning("MPS control daemon %d still runs %g s after quit; terminating it", proc.pid, self.quit_s)
                proc.terminate()
                try:
                    proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        _kill_group(proc.pid)
        try:
            self.pid_file.unlink()
        except FileNotFoundError:
            pass
        with self._lock:
            self._proc = self._identity = None

    def __enter__(self) -> MpsDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group(pgid: int) -> None:
    """SIGKILL whatever is left in the daemon's process group (its MPS servers)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def ensure_detached(state_dir: Path, binary: str = MPS_CONTROL, ready_s: float = 10.0) -> NodeIsolation:
    """A control daemon on STATE/mps/pipe for the embedded pool: `-d` unless one already answers.

    The daemon stays after the caller exits, as pool infrastructure shared by every
    `gpupool run` on the state dir; end it with `stop_detached(state_dir)`.
    """
    path = find_binary(binary)
    pipe_dir, log_dir = mps_dirs(state_dir)
    pipe_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    isolation = NodeIsolation(IsolationMode.MPS, str(pipe_dir), str(log_dir))
    # Concurrent runs on one state dir: one of them starts the daemon, the others find it.
    with open(pipe_dir.parent / "start.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if answers(pipe_dir, log_dir, path):
            return isolation
        done = subprocess.run(
            [path, "-d"],
            env=control_env(pipe_dir, log_dir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise Unavailable(
                f"{binary} -d exited with {done.returncode} ({done.stderr.strip()}): see "
                f"{log_dir}/control.log, or use --isolation hooks"
            )
        deadline = time.monotonic() + ready_s
        while not answers(pipe_dir, log_dir, path, timeout_s=2.0):
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"{binary} -d started but does not answer on {pipe_dir} within "
                    f"{ready_s:g} s: see {log_dir}/control.log"
                )
            time.sleep(0.05)
    log.info("MPS control daemon started in the background for %s", pipe_dir)
    return isolation


def stop_detached(state_dir: Path, binary: str = MPS_CONTROL) -> bool:
    """Quit the background daemon of `ensure_detached`; False when none answered."""
    pipe_dir, log_dir = mps_dirs(state_dir)
    if not answers(pipe_dir, log_dir, binary):
        return False
    control("quit", pipe_dir, log_dir, binary)
    return True


__all__ = [
    "MPS_CONTROL",
    "MpsDaemon",
    "MpsUnavailable",
    "control",
    "answers",
    "ensure_detached",
    "stop_detached",
    "mps_dirs",
]
