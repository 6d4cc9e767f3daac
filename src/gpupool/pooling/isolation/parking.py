"""Park a lease's GPU state in host memory and bring it back: the backends of suspend/resume.

`cuda` drives the driver's process checkpoint API (CUDA driver >= 12.8, through `cuda-bindings`,
imported only when first used) from outside the processes: lock each, then checkpoint each (the
driver copies the process's device memory into its own host memory and releases the GPU);
resume restores each, optionally onto other GPUs of the same model, then unlocks. On an H100
(driver 580) checkpointing 1/8/30 GiB took 2.4/4.5/16.4 s and restoring 1.0/2.1/5.7 s; lock and
unlock take milliseconds (benchmarks/bench_suspend_gpu.py measures yours).

`emulated` does the same to emulated GPUs with real processes: SIGSTOP stands for the lock, and
the process's rows leave the emulated usage file (EMULATED_USAGE_ENV) while it is parked.

Both undo what they did when a step fails, so a process is either running on its GPU or parked
and locked, never half of each. Standard library only at import time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

from ...core.errors import CheckpointFailed, InvalidInput
from .emulated_usage import SHAPE, Usage, UsageRow, read_usage, write_usage
from .env import EMULATED_USAGE_ENV, SUSPEND_BACKENDS
from .proctree import send_signal

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

MIB = 1024 * 1024
BACKENDS = SUSPEND_BACKENDS
# The first driver with cuCheckpointProcess* (cuDriverGetVersion's 1000 * major + 10 * minor).
CUDA_CHECKPOINT_DRIVER = 12080
SUSPEND_EXTRA = "pip install 'gpupool[suspend]'"
_STOP_POLL_S = 0.005


@dataclass(frozen=True)
class Parked:
    """What one suspend parked: the processes, and about how much GPU memory went to host memory."""

    pids: Tuple[int, ...]
    host_bytes: int


class Backend(Protocol):
    """Parks and brings back the GPU state of processes, by pid, from outside them. Resume with
    the backend object that suspended: the emulated one keeps the parked usage rows."""

    name: str

    def gpu_pids(self, pids: Sequence[int]) -> List[int]:
        """Those of `pids` that hold GPU state now, in the given order."""
        ...

    def suspend(self, pids: Sequence[int], lock_timeout_s: float) -> Parked:
        """Lock, then park, those of `pids` that hold GPU state; all or none (CheckpointFailed).
        The other pids are left alone (stopping the rest of a tree is the caller's); a process
        that ends meanwhile is skipped."""
        ...

    def resume(self, parked: Parked, remap: Mapping[str, str]) -> None:
        """Restore, then unlock; all or none (CheckpointFailed leaves every process parked).
        `remap` is {} for the same GPUs, else old UUID -> new UUID for every GPU the processes
        used (unmoved ones too: the driver wants every checkpointed GPU named)."""
        ...


def backend_named(name: str, usage_file: str = "", emulated: bool = False) -> Backend:
    """The backend `name` ("cuda", "emulated", "auto"); auto is emulated when the lease's GPUs are
    (`emulated`) or EMULATED_USAGE_ENV names a file. `usage_file` is the file where that env names
    none (the pool's own, PoolStatus.emulated_usage)."""
    chosen = name.strip().lower()
    file = os.environ.get(EMULATED_USAGE_ENV, "").strip() or usage_file
    if chosen == "auto":
        chosen = "emulated" if emulated or os.environ.get(EMULATED_USAGE_ENV, "").strip() else "cuda"
    if chosen == "cuda":
        return CudaBackend()
    if chosen == "emulated":
        if not file:
            raise InvalidInput(
                f"the emulated suspend backend needs a usage file: set {EMULATED_USAGE_ENV} to one "
                "(a pool of emulated GPUs names its own in its status)"
            )
        return EmulatedBackend(file)
    raise InvalidInput(f"suspend backend {name!r} is not one of {', '.join(BACKENDS)}")


def cuda_unavailable_reason() -> Optional[str]:
    """None when the cuda backend can work on this machine, else why not, in one line."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return f"cuda-bindings is not installed ({SUSPEND_EXTRA})"
    if not hasattr(cu, "cuCheckpointProcessLock"):
        return f"this cuda-bindings has no process checkpoint API (cuda-bindings >= 12.8 needed: {SUSPEND_EXTRA})"
    try:
        (err,) = cu.cuInit(0)
    except RuntimeError:  # the bindings raise when libcuda.so cannot be loaded at all
        return "no NVIDIA driver (libcuda) here"
    if err != cu.CUresult.CUDA_SUCCESS:
        return f"the CUDA driver did not start: cuInit gave {_result_name(err)}"
    err, version = cu.cuDriverGetVersion()
    if err != cu.CUresult.CUDA_SUCCESS:
        return f"the CUDA driver's version is unknown: cuDriverGetVersion gave {_result_name(err)}"
    if version < CUDA_CHECKPOINT_DRIVER:
        return (
            f"the driver has no process checkpoint API (CUDA driver >= 12.8 needed; "
            f"this one is {version // 1000}.{version % 1000 // 10})"
        )
    return None


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie has ended: it holds no GPU state)."""
    return _state(pid) not in ("", "Z", "X")


def _result_name(err: Any) -> str:
    return str(getattr(err, "name", err))


# --- cuda ---------------------------------------------------------------------------------------
class CudaBackend:
    """The driver's process checkpoint API; the bindings load and the driver starts at first use."""

    name = "cuda"

    def __init__(self) -> None:
        self._cu: Any = None
        # Seconds of each step of the last suspend or resume (lock, measure, checkpoint; restore, unlock).
        self.timings: Dict[str, float] = {}

    def _driver(self) -> Any:
        if self._cu is None:
            reason = cuda_unavailable_reason()  # also runs cuInit, which restore needs in this process
            if reason is not None:
                raise CheckpointFailed(f"the cuda suspend backend cannot work here: {reason}")
            from cuda.bindings import driver as cu

            self._cu = cu
        return self._cu

    def _call(self, what: str, pid: int, *args: Any) -> Any:
        """Call cu.<what>(pid, *args); CheckpointFailed naming the pid, the call and the result."""
        cu = self._driver()
        try:
            answer = getattr(cu, what)(pid, *args)
        except RuntimeError as err:  # a driver without the symbol
            raise CheckpointFailed(f"{what}(pid {pid}) failed: {err}") from None
        if answer[0] != cu.CUresult.CUDA_SUCCESS:
            raise CheckpointFailed(f"{what}(pid {pid}) failed: {_result_name(answer[0])}")
        return answer[1] if len(answer) > 1 else None

    def gpu_pids(self, pids: Sequence[int]) -> List[int]:
        cu = self._driver()
        held = []
        for pid in pids:
            try:
                err = cu.cuCheckpointProcessGetState(pid)[0]
            except RuntimeError:
                continue
            if err == cu.CUresult.CUDA_SUCCESS:
                held.append(pid)
        return held

    def state(self, pid: int) -> str:
        """The driver's state of `pid`: "CU_PROCESS_STATE_RUNNING", "..._LOCKED", "..._CHECKPOINTED"..."""
        return _result_name(self._call("cuCheckpointProcessGetState", pid))

    def _lock(self, pid: int, timeout_s: float = 10.0) -> None:
        args = self._driver().CUcheckpointLockArgs()
        args.timeoutMs = max(1, int(timeout_s * 1000))  # the driver reads 0 as "wait forever"
        self._call("cuCheckpointProcessLock", pid, args)

    def _checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", pid, None)

    def _restore(self, pid: int, args: Any = None) -> None:
        self._call("cuCheckpointProcessRestore", pid, args)

    def _unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", pid, None)

    def _restore_args(self, remap: Mapping[str, str]) -> Any:
        if not remap:
            return None
        cu = self._driver()
        pairs = []
        for old, new in remap.items():
            pair = cu.CUcheckpointGpuPair()
            # CUuuid.bytes is read-only in the bindings: write the 16 bytes in place.
            _write_uuid(pair.oldUuid, old)
            _write_uuid(pair.newUuid, new)
            pairs.append(pair)
        args = cu.CUcheckpointRestoreArgs()
        args.gpuPairs = pairs
        args.gpuPairsCount = len(pairs)
        return args

    def suspend(self, pids: Sequence[int], lock_timeout_s: float) -> Parked:
        # Lock every process before moving any memory: a job's processes then stop together.
        locked: List[int] = []
        parked: List[int] = []
        try:
            clock = _Clock(self.timings)
            for pid in self.gpu_pids(pids):
                _skip_if_gone(pid, partial(self._lock, timeout_s=lock_timeout_s), locked)
            clock.lap("lock_s")
            host_bytes = _gpu_bytes_by_pid(locked)
            clock.lap("measure_s")
            for pid in list(locked):
                _skip_if_gone(pid, self._checkpoint, parked)
            clock.lap("checkpoint_s")
            locked = [pid for pid in locked if pid in parked]  # vanished ones need no unlock
        except CheckpointFailed:
            for pid in reversed(parked):
                _quietly(self._restore, pid)
            for pid in reversed(locked):
                _quietly(self._unlock, pid)
            raise
        return Parked(tuple(parked), sum(host_bytes.get(pid, 0) for pid in parked))

    def resume(self, parked: Parked, remap: Mapping[str, str]) -> None:
        args = self._restore_args(remap)
        restored: List[int] = []
        unlocked: List[int] = []
        try:
            clock = _Clock(self.timings)
            for pid in parked.pids:
                _skip_if_gone(pid, partial(self._restore, args=args), restored)
            clock.lap("restore_s")
            for pid in restored:
                _skip_if_gone(pid, self._unlock, unlocked)
            clock.lap("unlock_s")
        except CheckpointFailed:
            # Park again what came back, so no process runs on a GPU another lease may now hold.
            for pid in unlocked:
                _quietly(self._lock, pid)
            for pid in restored:
                _quietly(self._checkpoint, pid)
            raise


class _Clock:
    """Writes the seconds since the previous lap into `into[name]`; `into` starts empty."""

    def __init__(self, into: Dict[str, float]) -> None:
        into.clear()
        self.into = into
        self.last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.into[name] = now - self.last
        self.last = now


def _write_uuid(target: Any, text: str) -> None:
    """Write a 'GPU-xxxxxxxx-xxxx-...' UUID into a CUuuid struct of the bindings."""
    import ctypes
    import uuid

    try:
        raw = uuid.UUID(text[4:] if text.startswith(("GPU-", "MIG-")) else text).bytes
    except ValueError:
        # CheckpointFailed, not InvalidInput: a caller of resume handles one error, and nothing was restored yet.
        raise CheckpointFailed(
            f"cannot remap GPU {text!r}: not a GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx UUID"
        ) from None
    ctypes.memmove(target.getPtr(), raw, len(raw))


def _gpu_bytes_by_pid(pids: Sequence[int]) -> Dict[int, int]:
    """GPU memory each pid uses now, as nvidia-smi lists it (summed over GPUs); {} when it cannot."""
    if not pids:
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    wanted = set(pids)
    used: Dict[int, int] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[0]) in wanted:
            used[int(parts[0])] = used.get(int(parts[0]), 0) + int(parts[1]) * MIB
    return used


def _skip_if_gone(pid: int, step: Callable[[int], object], done: List[int]) -> None:
    """Run `step(pid)` and note `pid` done; a process that ended meanwhile is skipped, not an error."""
    try:
        step(pid)
    except CheckpointFailed:
        if _alive(pid):
            raise
        return
    done.append(pid)


def _quietly(step: Callable[[int], object], pid: int) -> None:
    """An undo step: its own failure must not hide the error being raised."""
    try:
        step(pid)
    except CheckpointFailed:
        pass


# --- emulated -----------------------------------------------------------------------------------
class EmulatedBackend:
    """Emulated GPUs: SIGSTOP/SIGCONT for lock/unlock, and the usage file's rows moved out and back."""

    name = "emulated"

    def __init__(self, usage_file: str) -> None:
        self.usage_file = usage_file
        # pid -> {uuid: MiB}: the rows a suspend took out of the usage file, until resume puts them back.
        self._held: Dict[int, Dict[str, UsageRow]] = {}

    def gpu_pids(self, pids: Sequence[int]) -> List[int]:
        listed = {pid for rows in _read_usage(self.usage_file).values() for pid in rows}
        return [pid for pid in pids if int(pid) in listed]

    def suspend(self, pids: Sequence[int], lock_timeout_s: float) -> Parked:
        stopped: List[int] = []
        try:
            for pid in self.gpu_pids(pids):
                _skip_if_gone(pid, partial(_stop, timeout_s=lock_timeout_s), stopped)
            taken = self._update(lambda usage: _take(usage, stopped))
        except (CheckpointFailed, OSError) as err:
            for pid in stopped:
                send_signal(pid, signal.SIGCONT)
            if isinstance(err, CheckpointFailed):
                raise
            raise CheckpointFailed(f"emulated suspend could not rewrite {self.usage_file}: {err}") from None
        self._held.update(taken)
        host_bytes = sum(row.memory_mib for rows in taken.values() for row in rows.values()) * MIB
        return Parked(tuple(stopped), host_bytes)

    def resume(self, parked: Parked, remap: Mapping[str, str]) -> None:
        rows = {pid: self._held.get(pid, {}) for pid in parked.pids if _alive(pid)}
        try:
            self._update(lambda usage: _put(usage, rows, remap))
        except OSError as err:  # nothing was continued: every process stays parked
            raise CheckpointFailed(f"emulated resume could not rewrite {self.usage_file}: {err}") from None
        for pid in parked.pids:
            self._held.pop(pid, None)
            send_signal(pid, signal.SIGCONT)

    def _update(self, change: Callable[[Usage], Dict[int, Dict[str, UsageRow]]]) -> Dict[int, Dict[str, UsageRow]]:
        """Read, change and atomically rewrite the usage file under a lock of its own."""
        import fcntl

        with open(self.usage_file + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            usage = _read_usage(self.usage_file)
            result = change(usage)
            write_usage(self.usage_file, usage)
        return result


def _stop(pid: int, timeout_s: float) -> None:
    """SIGSTOP `pid` and wait until it is stopped: the emulated lock returns once the process is."""
    if not send_signal(pid, signal.SIGSTOP):
        raise CheckpointFailed(f"emulated lock of pid {pid} failed: ESRCH")
    deadline = time.monotonic() + timeout_s
    while _state(pid) not in ("T", "t"):
        if not _alive(pid):
            raise CheckpointFailed(f"emulated lock of pid {pid} failed: the process ended")
        if time.monotonic() > deadline:
            raise CheckpointFailed(f"emulated lock of pid {pid} failed: not stopped within {timeout_s:g} s (TIMEOUT)")
        time.sleep(_STOP_POLL_S)


def _state(pid: int) -> str:
    """The one-letter state of /proc/PID/stat ("T" stopped, "Z" zombie ...); "" when there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return ""
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3].decode()


def _take(usage: Usage, pids: Sequence[int]) -> Dict[int, Dict[str, UsageRow]]:
    taken: Dict[int, Dict[str, UsageRow]] = {}
    for uuid, rows in usage.items():
        for pid in pids:
            if pid in rows:
                taken.setdefault(pid, {})[uuid] = rows.pop(pid)
    return taken


def _put(
    usage: Usage, rows: Mapping[int, Mapping[str, UsageRow]], remap: Mapping[str, str]
) -> Dict[int, Dict[str, UsageRow]]:
    for pid, per_gpu in rows.items():
        for uuid, row in per_gpu.items():
            usage.setdefault(remap.get(uuid, uuid), {})[pid] = row
    return {}


def _read_usage(path: str) -> Usage:
    """The usage file; a missing file is empty, a damaged one CheckpointFailed."""
    try:
        return read_usage(path)
    except (OSError, ValueError) as err:
        raise CheckpointFailed(f"cannot read the emulated usage file {path} ({SHAPE}): {err}") from None
