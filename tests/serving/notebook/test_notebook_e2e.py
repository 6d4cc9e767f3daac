"""Issue 29 end to end on emulated GPUs: real jupyter_client and ipykernel, a real server, real runners.

A gpupool kernelspec is installed in a private Jupyter data dir and started with KernelManager
(no browser). The emulated usage file stands in for NVML; each kernel's process is added to it
the way a CUDA process would appear, so the emulated backend parks and restores it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import httpx
import pytest

from tests.conftest import ServerProcess
from tests.pooling.pool.test_suspend_e2e import Usage, proc_state
from tests.waiting import holds, wait_until

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

from jupyter_client.blocking.client import BlockingKernelClient  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

pytestmark = pytest.mark.slow

GIB = 1024


class Notebooks:
    """A server with one emulated 16 GiB GPU, the Jupyter dirs and the env of kernels against it."""

    def __init__(self, server: ServerProcess, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.server, self.tmp = server, tmp
        (tmp / "home").mkdir()
        self.usage = Usage(tmp / "usage.json")
        env = dict(
            server.client_env(tmp),
            GPUPOOL_SERVER=server.url,
            GPUPOOL_EMULATED_USAGE=str(self.usage.path),
            JUPYTER_DATA_DIR=str(tmp / "jupyter"),
            JUPYTER_PATH=str(tmp / "jupyter"),
            JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),
            JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"),
            JUPYTER_PLATFORM_DIRS="1",
        )
        for key in [k for k in os.environ if k.startswith(("GPUPOOL_", "JUPYTER_"))]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        self.env = env
        self.managers: List[KernelManager] = []

    def install(self, name: str, *flags: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "gpupool", "kernel", "install", name, *flags],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    def start(self, name: str) -> Tuple[KernelManager, BlockingKernelClient]:
        km = KernelManager(kernel_name=name)
        km.start_kernel()
        self.managers.append(km)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        return km, kc

    def status(self) -> Dict[str, Any]:
        answer = httpx.get(f"{self.server.url}/v1/status", headers=self.server.headers(), timeout=10)
        answer.raise_for_status()
        return dict(answer.json())

    def leases(self, name: str = "") -> List[Dict[str, Any]]:
        found = self.status()["leases"]
        return [x for x in found if x["holder"]["label"].startswith(f"kernel:{name}")]

    def lease_of(self, km: KernelManager) -> Dict[str, Any]:
        return next(x for x in self.leases() if x["holder"]["label"].split(" ")[0].endswith(f":{km.kernel_id}"))

    def ended_as(self, lease_id: str) -> str:
        """How lease `lease_id` ended, by the server's history (released, expired, ...); '' if it has not."""
        answer = httpx.get(
            f"{self.server.url}/v1/history", params={"since": "3600"}, headers=self.server.headers(), timeout=30
        )
        answer.raise_for_status()
        return next((str(r["ended"]) for r in answer.json()["leases"] if r["lease"] == lease_id), "")

    def allocated_mib(self) -> int:
        return sum(int(d["allocated_mib"]) for d in self.status()["devices"])

    def wait_state(self, km: KernelManager, state: str, timeout: float = 60.0) -> Dict[str, Any]:
        return wait_until(
            lambda: (lease := self.lease_of(km))["state"] == state and lease,
            timeout,
            f"the kernel's lease to be {state}",
            detail=lambda: self.lease_of(km)["state"],
        )

    def on_gpu(self, kc: BlockingKernelClient, lease: Dict[str, Any], mib: int) -> int:
        """Add the kernel's process to the usage file (as CUDA would appear in NVML); its pid."""
        pid = int(run_cell(kc, "import os; print(os.getpid())")[0].strip())
        self.usage.add(lease["devices"][0]["uuid"], pid, mib)
        return pid

    def shutdown_all(self) -> None:
        for km in self.managers:
            if km.has_kernel:
                km.shutdown_kernel(now=True)


def cell_started(kc: BlockingKernelClient, msg_id: str) -> bool:
    """Whether the kernel has announced the cell `msg_id` (execute_input, just before it runs it); reads
    one iopub message (execute_interactive skips the ones of other cells)."""
    try:
        msg = kc.get_iopub_msg(timeout=0.5)
    except queue.Empty:
        return False
    return msg["msg_type"] == "execute_input" and msg["parent_header"].get("msg_id") == msg_id


def run_cell(kc: BlockingKernelClient, code: str, timeout: float = 60.0) -> Tuple[str, str, Dict[str, Any]]:
    """(stdout, stderr, reply content) of one cell."""
    out: List[str] = []
    err: List[str] = []

    def output(msg: Dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            (out if msg["content"]["name"] == "stdout" else err).append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            err.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=output)
    return "".join(out), "".join(err), reply["content"]


@pytest.fixture
def notebooks(server_factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Notebooks]:
    books = Notebooks(server_factory("--devices", "emulated:1x16GiB", "--ttl", "4"), tmp_path, monkeypatch)
    yield books
    books.shutdown_all()


def wait_gone(pids: List[int], timeout: float = 20.0) -> None:
    left = lambda: [p for p in pids if proc_state(p) not in ("", "Z")]  # noqa: E731
    wait_until(lambda: not left(), timeout, f"{pids} to end", detail=left)


def test_a_kernel_holds_its_share_and_sees_its_gpu(notebooks: Notebooks) -> None:
    notebooks.install("quarter", "--fraction", "0.25", "--idle-suspend", "1h")
    km, kc = notebooks.start("quarter")
    leases = notebooks.leases("quarter")
    assert len(leases) == 1, leases
    lease = leases[0]
    assert lease["devices"][0]["memory_mib"] == 4 * GIB and notebooks.allocated_mib() == 4 * GIB
    out, err, reply = run_cell(kc, 'import os; print(os.environ["CUDA_VISIBLE_DEVICES"])')
    assert reply["status"] == "ok", err
    assert out.strip() == lease["devices"][0]["uuid"]
    assert run_cell(kc, "print(6 * 7)")[0].strip() == "42"
    # input(): the kernel's request on stdin finds the frontend through the proxy
    msg_id = kc.execute("answer = input('name? ')", allow_stdin=True)
    asked = kc.get_stdin_msg(timeout=10)
    assert asked["msg_type"] == "input_request" and asked["parent_header"]["msg_id"] == msg_id
    kc.input("gpupool")
    assert kc.get_shell_msg(timeout=10)["content"]["status"] == "ok"
    assert run_cell(kc, "print(answer)")[0].strip() == "gpupool"
    kc.stop_channels()


def test_idle_kernels_give_the_gpu_to_each_other(notebooks: Notebooks) -> None:
    notebooks.install("a", "--fraction", "0.75", "--idle-suspend", "2s")
    notebooks.install("b", "--fraction", "0.75", "--idle-suspend", "1h")
    km_a, kc_a = notebooks.start("a")
    lease_a = notebooks.lease_of(km_a)
    pid_a = notebooks.on_gpu(kc_a, lease_a, 10 * GIB)
    run_cell(kc_a, "x = sum(range(1000))")
    assert notebooks.allocated_mib() == 12 * GIB

    # (2) idle for 2 s: suspended, its memory free in the pool, its process parked
    parked = notebooks.wait_state(km_a, "suspended", timeout=60)
    assert parked["devices"] == [] and notebooks.allocated_mib() == 0
    assert proc_state(pid_a) == "T" and pid_a not in notebooks.usage.pids()

    # (3) a second kernel takes that memory
    km_b, kc_b = notebooks.start("b")
    lease_b = notebooks.lease_of(km_b)
    pid_b = notebooks.on_gpu(kc_b, lease_b, 10 * GIB)
    assert notebooks.allocated_mib() == 12 * GIB

    # A's next cell waits for room: one line on stderr says so, in that cell
    msg_id = kc_a.execute("print(x + 1)")
    waited = []
    deadline = time.monotonic() + 20
    while not waited and time.monotonic() < deadline:
        msg = kc_a.get_iopub_msg(timeout=20)
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stderr":
            assert msg["parent_header"]["msg_id"] == msg_id
            waited.append(msg["content"]["text"])
    assert waited and "waiting for the GPU: " in waited[0] and "ahead in queue default" in waited[0], waited
    assert notebooks.lease_of(km_a)["state"] == "suspended"

    # B is shut down: A resumes, and the cell returns the right result
    kc_b.stop_channels()
    km_b.shutdown_kernel()
    wait_gone([pid_b])
    reply = kc_a.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok"
    out = []
    while True:
        msg = kc_a.get_iopub_msg(timeout=10)
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    assert "".join(out).strip() == "499501"
    assert notebooks.lease_of(km_a)["id"] == lease_a["id"], "the same lease came back"
    assert proc_state(pid_a) in ("S", "R") and pid_a in notebooks.usage.pids()
    kc_a.stop_channels()


def test_a_second_kernel_resumes_the_first_after_it_idles(notebooks: Notebooks) -> None:
    notebooks.install("a", "--fraction", "0.75", "--idle-suspend", "2s")
    km_a, kc_a = notebooks.start("a")
    notebooks.on_gpu(kc_a, notebooks.lease_of(km_a), 10 * GIB)
    run_cell(kc_a, "state = [3, 4]")
    notebooks.wait_state(km_a, "suspended", timeout=60)
    km_b, kc_b = notebooks.start("a")  # the same spec: it too goes idle and is suspended
    notebooks.on_gpu(kc_b, notebooks.lease_of(km_b), 10 * GIB)
    notebooks.wait_state(km_b, "suspended", timeout=60)
    started = time.monotonic()
    out, err, reply = run_cell(kc_a, "print(sum(v * v for v in state))")
    assert reply["status"] == "ok" and out.strip() == "25", err
    assert notebooks.lease_of(km_a)["state"] == "running"
    print(f"the cell ran {time.monotonic() - started:.2f} s after it was sent (a resume included)")
    kc_a.stop_channels()
    kc_b.stop_channels()


def tree_of(km: KernelManager) -> List[int]:
    """The runner and every process under it."""
    from gpupool.pooling.isolation.proctree import descendants

    runner = km.provisioner.pid  # type: ignore[union-attr]
    return [runner, *descendants(runner)]


def test_shutdown_restart_and_interrupt_leave_nothing_behind(notebooks: Notebooks) -> None:
    notebooks.install("k", "--fraction", "0.25", "--idle-suspend", "1h")
    km, kc = notebooks.start("k")
    first = notebooks.lease_of(km)["id"]
    first_tree = tree_of(km)

    # interrupt: the kernel stops the cell and lives on, on the same lease (also after many)
    for _ in range(4):
        msg_id = kc.execute("import time; time.sleep(60)", stop_on_error=False)
        # the cell under way (an interrupt before it runs is the other case): its execute_input is out
        wait_until(lambda m=msg_id: cell_started(kc, m), 60, "the cell to start")
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=10)
        while reply["msg_type"] == "kernel_info_reply":  # late: wait_for_ready asks again after 1 s
            reply = kc.get_shell_msg(timeout=10)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert run_cell(kc, "print('alive')")[0].strip() == "alive"
    assert [x["id"] for x in notebooks.leases("k")] == [first]

    # restart: a new lease, the old one released and its processes gone
    km.restart_kernel()
    kc.wait_for_ready(timeout=60)
    wait_gone(first_tree)
    leases = notebooks.leases("k")
    assert len(leases) == 1 and leases[0]["id"] != first, leases
    assert run_cell(kc, "print(1 + 1)")[0].strip() == "2"

    # shutdown: no lease, no process
    second_tree = tree_of(km)
    kc.stop_channels()
    km.shutdown_kernel()
    wait_gone(second_tree)
    assert notebooks.leases("k") == [] and notebooks.allocated_mib() == 0


JUPYTER_SIDE = """
import json, sys, time
from jupyter_client.manager import KernelManager
from gpupool.pooling.isolation.proctree import descendants
km = KernelManager(kernel_name=sys.argv[1])
km.start_kernel()
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)
runner = km.provisioner.pid
print(json.dumps({"kernel_id": km.kernel_id, "tree": [runner, *descendants(runner)]}), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("suspended", [False, True], ids=["running", "suspended"])
def test_kill_9_of_the_jupyter_process_leaves_nothing(notebooks: Notebooks, suspended: bool) -> None:
    notebooks.install("k", "--fraction", "0.25", "--idle-suspend", "1s" if suspended else "1h")
    jupyter = subprocess.Popen(
        [sys.executable, "-c", JUPYTER_SIDE, "k"], env=notebooks.env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert jupyter.stdout is not None
        started = json.loads(jupyter.stdout.readline())
        leases = notebooks.leases("k")
        assert len(leases) == 1 and started["kernel_id"] in leases[0]["holder"]["label"]
        if suspended:
            wait_until(lambda: notebooks.leases("k")[0]["state"] == "suspended", 60, "the kernel's lease suspended")
            assert "T" in [proc_state(p) for p in started["tree"]], "the kernel is parked (stopped)"
        jupyter.send_signal(signal.SIGKILL)
        jupyter.wait(10)
        killed = time.monotonic()
        wait_gone(started["tree"])
        wait_until(lambda: notebooks.leases("k") == [], 60, "the lease to go with the killed kernel")
        print(f"the lease was gone {time.monotonic() - killed:.2f} s after the kill")
        # released by the runner, not left to expire: the history says how it ended, however late
        assert notebooks.ended_as(leases[0]["id"]) == "released", "the runner released the lease (not left to expire)"
    finally:
        if jupyter.poll() is None:
            jupyter.kill()
            jupyter.wait()


def test_where_suspend_cannot_work_idle_keeps_the_lease_and_says_why_once(
    notebooks: Notebooks, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("GPUPOOL_EMULATED_USAGE")
    monkeypatch.setenv("GPUPOOL_SUSPEND_BACKEND", "cuda")  # absent here (auto would park emulated GPUs)
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    notebooks.install("k", "--fraction", "0.25", "--idle-suspend", "1s")
    caplog.set_level("WARNING", logger="gpupool.serving.notebook.gate")
    km, kc = notebooks.start("k")
    lease = notebooks.lease_of(km)
    told = lambda: [r for r in caplog.records if "idle suspend releases nothing" in r.getMessage()]  # noqa: E731
    wait_until(told, 20, "the gate to say why idle releases nothing")
    holds(lambda: len(told()) == 1, 2.5, "no second try, no second line")  # two more idle limits and more
    said = [r.getMessage() for r in caplog.records if "idle suspend releases nothing" in r.getMessage()]
    assert len(said) == 1 and "cuda" in said[0], said  # the runner's reason: no cuda-bindings here
    assert notebooks.lease_of(km)["state"] == "running" and notebooks.lease_of(km)["id"] == lease["id"]
    assert notebooks.allocated_mib() == 4 * GIB
    assert run_cell(kc, "print('still here')")[0].strip() == "still here"
    kc.stop_channels()


def test_a_lease_suspended_elsewhere_is_resumed_by_the_next_cell(notebooks: Notebooks) -> None:
    notebooks.install("k", "--fraction", "0.25", "--idle-suspend", "1h")
    km, kc = notebooks.start("k")
    lease = notebooks.lease_of(km)
    pid = notebooks.on_gpu(kc, lease, 2 * GIB)
    run_cell(kc, "y = 20")
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "suspend", lease["id"], "--reason", "lunch"],
        env=notebooks.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert proc_state(pid) == "T"
    # the gate reads the lease every second: one read lets it know (no sign of that read outside the
    # kernel; were it late, the cell is resumed all the same, the case just below)
    time.sleep(1.5)
    out, err, reply = run_cell(kc, "print(y + 1)", timeout=30)
    assert reply["status"] == "ok" and out.strip() == "21", err
    assert notebooks.lease_of(km)["state"] == "running" and proc_state(pid) in ("S", "R")
    # again, and the cell sent at once: it reached the parked kernel before the gate knew
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "suspend", lease["id"]], env=notebooks.env, capture_output=True, timeout=60
    )
    assert done.returncode == 0
    out, err, reply = run_cell(kc, "print(y + 2)", timeout=30)
    assert reply["status"] == "ok" and out.strip() == "22", err
    kc.stop_channels()


def test_restart_and_shutdown_of_a_parked_kernel_leave_nothing(notebooks: Notebooks) -> None:
    notebooks.install("k", "--fraction", "0.25", "--idle-suspend", "1s")
    km, kc = notebooks.start("k")
    notebooks.on_gpu(kc, notebooks.lease_of(km), GIB)
    parked = notebooks.wait_state(km, "suspended", timeout=60)
    old_tree = tree_of(km)
    started = time.monotonic()
    km.restart_kernel()
    kc.wait_for_ready(timeout=60)
    wait_gone(old_tree)
    leases = notebooks.leases("k")
    # a new lease; on a loaded machine its 1 s idle limit may have parked it already
    assert len(leases) == 1 and leases[0]["id"] != parked["id"], leases
    assert leases[0]["state"] in ("running", "suspended"), leases
    print(f"the restarted kernel held its new lease {time.monotonic() - started:.2f} s after the restart")
    assert run_cell(kc, "print(3)")[0].strip() == "3"
    notebooks.wait_state(km, "suspended", timeout=60)
    tree = tree_of(km)
    kc.stop_channels()
    km.shutdown_kernel()
    wait_gone(tree)
    assert notebooks.leases("k") == [] and notebooks.allocated_mib() == 0
