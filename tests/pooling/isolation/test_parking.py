"""The suspend/resume backends with real processes: the emulated one end to end, the cuda one's
refusal on a machine without a driver, and the import floor of the workload side."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from waiting import wait_until

from gpupool.core.errors import CheckpointFailed, InvalidInput
from gpupool.pooling.devices.usage import EMULATED_USAGE_ENV as DEVICES_USAGE_ENV
from gpupool.pooling.isolation.env import EMULATED_USAGE_ENV
from gpupool.pooling.isolation.parking import (
    MIB,
    CudaBackend,
    EmulatedBackend,
    Parked,
    backend_named,
    cuda_unavailable_reason,
)

GPU0 = "GPU-emu-localhost-0"
GPU1 = "GPU-emu-localhost-1"
SRC = str(Path(__file__).resolve().parents[3] / "src")


def state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2 :].split()[0].decode()


def read(path: Path) -> Dict[str, Dict[str, int]]:
    data: Dict[str, Dict[str, int]] = json.loads(path.read_text())
    return data


@pytest.fixture
def children() -> Iterator[List[subprocess.Popen]]:
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait()


@pytest.fixture
def usage(tmp_path: Path, children: List[subprocess.Popen]) -> Path:
    a, b, c = (p.pid for p in children)
    path = tmp_path / "usage.json"
    # a and b are the lease's GPU processes (b on both GPUs); c is another lease's.
    path.write_text(json.dumps({GPU0: {str(a): 1000, str(b): 200, str(c): 50}, GPU1: {str(b): 300}}))
    return path


def test_the_env_name_has_one_meaning():
    assert DEVICES_USAGE_ENV is EMULATED_USAGE_ENV == "GPUPOOL_EMULATED_USAGE"


def test_gpu_pids_are_those_in_the_usage_file(usage, children):
    a, b, c = (p.pid for p in children)
    backend = backend_named("emulated", str(usage))
    assert backend.gpu_pids([os.getpid(), b, a]) == [b, a]


def test_suspend_stops_and_moves_the_memory_out_resume_brings_it_back(usage, children):
    a, b, c = (p.pid for p in children)
    backend = backend_named("emulated", str(usage))
    parked = backend.suspend([a, b, os.getpid()], lock_timeout_s=5)  # the caller is no GPU process

    assert parked == Parked((a, b), (1000 + 200 + 300) * MIB)
    assert state(a) == state(b) == "T"
    assert state(c) != "T"  # untouched: running or sleeping
    assert read(usage) == {GPU0: {str(c): 50}, GPU1: {}}

    backend.resume(parked, {})
    assert read(usage) == {GPU0: {str(c): 50, str(a): 1000, str(b): 200}, GPU1: {str(b): 300}}
    wait_until(lambda: state(a) != "T" and state(b) != "T", 30, "both continued")


def test_resume_under_a_remap_writes_the_rows_to_the_new_gpus(usage, children):
    a, b, c = (p.pid for p in children)
    backend = backend_named("emulated", str(usage))
    parked = backend.suspend([a, b], lock_timeout_s=5)
    backend.resume(parked, {GPU0: GPU1, GPU1: GPU0})
    assert read(usage) == {GPU0: {str(c): 50, str(b): 300}, GPU1: {str(a): 1000, str(b): 200}}
    wait_until(lambda: state(a) != "T", 30, "a continued")


def test_a_process_that_vanished_is_skipped(usage, children):
    a, b, c = (p.pid for p in children)
    backend = backend_named("emulated", str(usage))
    children[0].kill()
    children[0].wait()
    parked = backend.suspend([a, b], lock_timeout_s=5)
    assert parked.pids == (b,)
    assert state(b) == "T"

    children[1].send_signal(signal.SIGKILL)  # and one that ends while parked
    children[1].wait()
    backend.resume(parked, {})
    assert str(b) not in read(usage)[GPU0]


def test_a_usage_file_it_cannot_rewrite_leaves_every_process_running(usage, children, monkeypatch):
    a, b, c = (p.pid for p in children)
    backend = backend_named("emulated", str(usage))

    def refuse(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gpupool.pooling.isolation.parking.write_usage", refuse)
    with pytest.raises(CheckpointFailed, match="could not rewrite"):
        backend.suspend([a, b], lock_timeout_s=5)
    wait_until(lambda: state(a) != "T" and state(b) != "T", 30, "both continued")
    assert str(a) in read(usage)[GPU0]


def test_a_resume_that_cannot_write_leaves_them_parked(usage, children, monkeypatch):
    a, b, c = (p.pid for p in children)
    backend = backend_named("emulated", str(usage))
    parked = backend.suspend([a, b], lock_timeout_s=5)

    def refuse(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("gpupool.pooling.isolation.parking.write_usage", refuse)
    with pytest.raises(CheckpointFailed, match="could not rewrite"):
        backend.resume(parked, {})
    assert state(a) == state(b) == "T"
    monkeypatch.undo()
    backend.resume(parked, {})  # the rows were kept: a later resume still brings them back
    assert read(usage)[GPU0][str(a)] == 1000


def test_a_damaged_usage_file_fails_cleanly(tmp_path, children):
    path = tmp_path / "usage.json"
    path.write_text("[1, 2")
    with pytest.raises(CheckpointFailed, match="usage.json"):
        backend_named("emulated", str(path)).suspend([children[0].pid], lock_timeout_s=5)
    assert state(children[0].pid) != "T", "a failed suspend leaves the process running (R or S), not stopped"


def test_backend_named(tmp_path, monkeypatch):
    monkeypatch.delenv(EMULATED_USAGE_ENV, raising=False)
    assert isinstance(backend_named("auto"), CudaBackend)
    assert backend_named("cuda").name == "cuda"
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(tmp_path / "u.json"))
    auto = backend_named("auto")
    assert isinstance(auto, EmulatedBackend) and auto.usage_file == str(tmp_path / "u.json")
    monkeypatch.delenv(EMULATED_USAGE_ENV)
    emulated = backend_named("auto", str(tmp_path / "pool.json"), emulated=True)  # the lease's GPUs say
    assert isinstance(emulated, EmulatedBackend) and emulated.usage_file == str(tmp_path / "pool.json")
    assert isinstance(backend_named("auto", str(tmp_path / "pool.json")), CudaBackend)
    with pytest.raises(InvalidInput, match=r"'criu' is not one of cuda, emulated, auto"):
        backend_named("criu")
    with pytest.raises(InvalidInput, match=EMULATED_USAGE_ENV):
        backend_named("emulated")


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA driver")
def test_cuda_says_why_it_cannot_work_here():
    reason = cuda_unavailable_reason()
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        assert reason == "cuda-bindings is not installed (pip install 'gpupool[suspend]')"
    else:
        assert reason == "no NVIDIA driver (libcuda) here"
    with pytest.raises(CheckpointFailed, match="cannot work here: " + reason.split(" (")[0]):
        CudaBackend().suspend([os.getpid()], lock_timeout_s=1)


def test_importing_the_backends_does_not_import_cuda():
    code = (
        "import sys, gpupool.pooling.isolation.parking as c; c.backend_named('cuda');"
        "print(sorted(m for m in sys.modules if m == 'cuda' or m.startswith('cuda.')))"
    )
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the cuda backend's steps and undo, against a stand-in driver ----------------------------------
class FakeDriver:
    """The checkpoint calls of cuda.bindings.driver with the driver's state machine per pid; the
    structs are the real ones of the bindings. `fail[(call, pid)]` makes that call fail once."""

    def __init__(self, cu, pids):
        self.cu = cu
        self.CUresult = cu.CUresult
        self.CUcheckpointLockArgs = cu.CUcheckpointLockArgs
        self.CUcheckpointRestoreArgs = cu.CUcheckpointRestoreArgs
        self.CUcheckpointGpuPair = cu.CUcheckpointGpuPair
        self.state = dict.fromkeys(pids, "RUNNING")
        self.calls = []
        self.fail = {}
        self.restore_pairs = []
        self.lock_timeouts_ms = []

    def _step(self, call, pid, before, after):
        self.calls.append((call, pid))
        if self.fail.pop((call, pid), None):
            return (self.CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        if self.state.get(pid) != before:
            return (
                self.CUresult.CUDA_ERROR_NOT_FOUND if pid not in self.state else self.CUresult.CUDA_ERROR_ILLEGAL_STATE,
            )
        self.state[pid] = after
        return (self.CUresult.CUDA_SUCCESS,)

    def cuCheckpointProcessGetState(self, pid):
        if pid not in self.state:
            return (self.CUresult.CUDA_ERROR_NOT_FOUND, None)
        return (self.CUresult.CUDA_SUCCESS, getattr(self.cu.CUprocessState, f"CU_PROCESS_STATE_{self.state[pid]}"))

    def cuCheckpointProcessLock(self, pid, args):
        self.lock_timeouts_ms.append(args.timeoutMs)
        return self._step("lock", pid, "RUNNING", "LOCKED")

    def cuCheckpointProcessCheckpoint(self, pid, args):
        return self._step("checkpoint", pid, "LOCKED", "CHECKPOINTED")

    def cuCheckpointProcessRestore(self, pid, args):
        if args is not None:
            self.restore_pairs.append(
                [(p.oldUuid.bytes.hex(), p.newUuid.bytes.hex()) for p in args.gpuPairs[: args.gpuPairsCount]]
            )
        return self._step("restore", pid, "CHECKPOINTED", "LOCKED")

    def cuCheckpointProcessUnlock(self, pid, args):
        return self._step("unlock", pid, "LOCKED", "RUNNING")


@pytest.fixture
def fake(children):
    cu = pytest.importorskip("cuda.bindings.driver")
    driver = FakeDriver(cu, [p.pid for p in children[:2]])
    backend = CudaBackend()
    backend._cu = driver
    return backend, driver


def test_cuda_suspend_locks_all_then_checkpoints_and_resume_restores_all_then_unlocks(fake, children):
    backend, driver = fake
    a, b, c = (p.pid for p in children)
    assert backend.gpu_pids([c, a, b]) == [a, b]
    parked = backend.suspend([a, b, c], lock_timeout_s=2.5)
    assert parked.pids == (a, b)
    assert driver.calls == [("lock", a), ("lock", b), ("checkpoint", a), ("checkpoint", b)]
    assert driver.lock_timeouts_ms == [2500, 2500]
    assert backend.state(a) == "CU_PROCESS_STATE_CHECKPOINTED"
    assert set(backend.timings) == {"lock_s", "measure_s", "checkpoint_s"}
    driver.calls.clear()
    backend.resume(parked, {})
    assert driver.calls == [("restore", a), ("restore", b), ("unlock", a), ("unlock", b)]
    assert driver.state == {a: "RUNNING", b: "RUNNING"}
    assert set(backend.timings) == {"restore_s", "unlock_s"}


def test_cuda_suspend_that_fails_undoes_every_step(fake, children):
    backend, driver = fake
    a, b, _ = (p.pid for p in children)
    driver.fail[("checkpoint", b)] = True
    with pytest.raises(CheckpointFailed) as err:
        backend.suspend([a, b], lock_timeout_s=2.5)
    assert err.value.message == f"cuCheckpointProcessCheckpoint(pid {b}) failed: CUDA_ERROR_ILLEGAL_STATE"
    assert driver.state == {a: "RUNNING", b: "RUNNING"}  # a restored and unlocked, b unlocked


def test_cuda_resume_that_fails_leaves_every_process_parked(fake, children):
    backend, driver = fake
    a, b, _ = (p.pid for p in children)
    parked = backend.suspend([a, b], lock_timeout_s=2.5)
    driver.fail[("restore", b)] = True
    with pytest.raises(CheckpointFailed, match=f"cuCheckpointProcessRestore\\(pid {b}\\) failed"):
        backend.resume(parked, {})
    assert driver.state == {a: "CHECKPOINTED", b: "CHECKPOINTED"}
    driver.fail[("unlock", b)] = True  # and one whose unlock fails after a's went through
    with pytest.raises(CheckpointFailed, match=f"cuCheckpointProcessUnlock\\(pid {b}\\) failed"):
        backend.resume(parked, {})
    assert driver.state == {a: "CHECKPOINTED", b: "CHECKPOINTED"}
    backend.resume(parked, {})
    assert driver.state == {a: "RUNNING", b: "RUNNING"}


def test_cuda_resume_passes_every_gpu_pair(fake, children):
    backend, driver = fake
    a = children[0].pid
    old, new = "GPU-12345678-1234-1234-1234-123456789abc", "GPU-abcdef01-2345-6789-abcd-ef0123456789"
    backend.resume(backend.suspend([a], lock_timeout_s=2.5), {old: new, new: old})
    assert driver.restore_pairs == [
        [
            ("12345678123412341234123456789abc", "abcdef0123456789abcdef0123456789"),
            ("abcdef0123456789abcdef0123456789", "12345678123412341234123456789abc"),
        ]
    ]
    with pytest.raises(CheckpointFailed, match="cannot remap GPU 'GPU-emu-localhost-0'"):
        backend.resume(Parked((a,), 0), {GPU0: new})


def test_cuda_skips_a_process_that_ended(fake, children):
    backend, driver = fake
    a, b, _ = (p.pid for p in children)
    children[1].kill()
    children[1].wait()
    driver.fail[("lock", b)] = True  # the driver still lists it, but its lock fails: it has ended
    parked = backend.suspend([a, b], lock_timeout_s=2.5)
    assert parked.pids == (a,)
