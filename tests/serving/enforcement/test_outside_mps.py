"""A lease's process outside MPS on an `mps` node (its client found no daemon when it made its CUDA
context, so no memory or SM limit holds it) is stopped at once; an MPS client, a row that does not
say, the MPS server itself and `hooks` nodes are left as they were. Real processes, the emulated
usage file (its `mps_client` flag stands where NVML's two process lists would), a real server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterable, List, Tuple

import httpx
import pytest
from clock import FakeClock
from waiting import wait_until

from gpupool.core.isolation_mode import IsolationMode, NodeIsolation
from gpupool.core.model import Claim, Device, Holder
from gpupool.core.usage import EnforceMode, ProcessUsage, UsageReport, Violation
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.devices import usage as device_usage
from gpupool.pooling.devices.usage import EMULATED_USAGE_ENV, UsageSampler
from gpupool.pooling.isolation.emulated_usage import UsageRow, parse_usage, read_usage, write_usage
from gpupool.pooling.isolation.evidence import NodeView, Witness, start_ticks
from gpupool.pooling.isolation.proctree import alive
from gpupool.pooling.pool import Pool
from gpupool.serving.enforcement.attest import Attestations
from tests.serving.enforcement.test_watchdog import Kills, watchdog

GIB = 1024
CLI = [sys.executable, "-m", "gpupool.cli.workload"]
HOLDER = str(Path(__file__).resolve().parents[2] / "workload" / "runner" / "holder.py")
MPS = NodeIsolation(IsolationMode.MPS, "/nowhere/mps/pipe", "/nowhere/mps/log")


@pytest.fixture
def pool(tmp_path: Path) -> Iterable[Pool]:
    p = Pool(tmp_path / "state", devices=emulated_devices("emulated:2x16GiB", "n1"))
    yield p
    p.close()


def own_lease(pool: Pool, attested: Attestations, fraction: float = 0.25) -> Tuple[str, str]:
    """A lease whose runner is this test process (so its children are the lease's processes)."""
    lease = pool.claim(Claim.single(1, fraction=fraction), Holder("alice", os.getpid(), socket.gethostname()))
    ticks = start_ticks(os.getpid())
    assert ticks is not None
    attested.add(lease.id, Witness(os.getpid(), ticks, os.getuid()))
    return lease.id, lease.slices[0].device_uuid


def test_a_lease_process_outside_mps_is_stopped_at_the_first_sample(pool, tmp_path, child):
    pool.set_isolation(MPS)
    clock, kills, usage, attested = FakeClock(), Kills(), tmp_path / "usage.json", Attestations()
    lease_id, uuid = own_lease(pool, attested)
    dog = watchdog(pool, usage, clock, kills, attested, grace_s=600.0)
    # 1 GiB, well within its 4 GiB share: the over-share rule has nothing to say; no cap holds it.
    write_usage(usage, {uuid: {child.pid: UsageRow(GIB, mps_client=False)}})
    report = dog.step()
    assert kills.calls == [[child.pid]], "no grace: the first sample stops it"
    (action,) = report.actions
    assert (action.reason, action.mode, action.pid, action.lease_id, action.memory_mib) == (
        Violation.OUTSIDE_MPS,
        EnforceMode.KILL,
        child.pid,
        lease_id,
        GIB,
    )
    assert action.describe().startswith(f"killed pid {child.pid} (outside_mps: lease {lease_id} of alice")
    assert report.actions_total["outside_mps"] == 1 and report.actions_total["over_share"] == 0
    assert [p.mps_client for p in report.processes] == [False]
    clock.now += 1
    dog.step()
    assert len(kills.calls) == 1, "one action per process, not one per sample"
    assert pool.status().usage.actions_total["outside_mps"] == 1


def test_a_client_a_row_that_does_not_say_and_the_mps_server_are_left_alone(pool, tmp_path, child):
    pool.set_isolation(MPS)
    clock, kills, usage, attested = FakeClock(), Kills(), tmp_path / "usage.json", Attestations()
    _, uuid = own_lease(pool, attested)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # The MPS server holds memory outside MPS too, but it is the daemon's child, below no runner: no
    # lease. Its stand-in is orphaned at birth, so it is no descendant of this test (the "runner").
    server = _orphan()
    try:
        write_usage(
            usage,
            {
                uuid: {
                    child.pid: UsageRow(GIB, mps_client=True),
                    other.pid: UsageRow(GIB),  # written before the flag: says nothing of MPS
                },
                pool.devices()[1].uuid: {server: UsageRow(512, mps_client=False)},
            },
        )
        dog = watchdog(pool, usage, clock, kills, attested, grace_s=600.0)
        for _ in range(3):
            report = dog.step()
            clock.now += 1
        assert not kills.calls and not report.actions
        by_pid = {p.pid: p for p in report.processes}
        assert by_pid[server].lease_id == "" and by_pid[child.pid].lease_id and by_pid[other.pid].lease_id
        assert (by_pid[child.pid].mps_client, by_pid[other.pid].mps_client) == (True, None)
    finally:
        other.kill()
        other.wait()
        os.kill(server, signal.SIGKILL)


def _orphan() -> int:
    """The pid of a sleeper whose parent exited at once (a grandchild of this test, reparented)."""
    spawn = (
        "import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    )
    pid = int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, timeout=30).stdout)
    assert os.getpid() not in NodeView().lineage(pid)
    return pid


def test_hooks_nodes_and_the_modes_of_the_rule(pool, tmp_path, child):
    clock, kills, usage, attested = FakeClock(), Kills(), tmp_path / "usage.json", Attestations()
    _, uuid = own_lease(pool, attested)
    write_usage(usage, {uuid: {child.pid: UsageRow(GIB, mps_client=False)}})
    # hooks (the default): every process is outside MPS there, and that is the mode's contract.
    assert watchdog(pool, usage, clock, kills, attested).step().actions == () and not kills.calls
    pool.set_isolation(MPS)
    warn = watchdog(pool, usage, clock, kills, attested, over_share=EnforceMode.WARN).step()
    assert [(a.reason, a.mode) for a in warn.actions] == [(Violation.OUTSIDE_MPS, EnforceMode.WARN)]
    assert not kills.calls
    off = watchdog(pool, usage, clock, kills, attested, over_share=EnforceMode.OFF).step()
    assert off.actions == () and off.actions_total["outside_mps"] == 0 and not kills.calls


def test_the_usage_file_keeps_old_rows_and_refuses_a_bad_flag(tmp_path):
    path = tmp_path / "usage.json"
    rows = {
        "GPU-a": {1: UsageRow(10), 2: UsageRow(20, 0.5), 3: UsageRow(30, mps_client=False), 4: UsageRow(40, 0.1, True)}
    }
    write_usage(str(path), rows)
    assert read_usage(str(path)) == rows
    written = json.loads(path.read_text())["GPU-a"]
    assert written["1"] == 10 and written["3"] == {"memory_mib": 30, "mps_client": False}
    assert parse_usage({"GPU-a": {"5": {"memory_mib": 5, "mps_client": None}}}) == {"GPU-a": {5: UsageRow(5)}}
    for bad in ("yes", 1, 0):
        with pytest.raises(ValueError, match="mps_client"):
            parse_usage({"GPU-a": {"5": {"memory_mib": 5, "mps_client": bad}}})


def test_the_flag_survives_the_usage_record():
    rows = (ProcessUsage(1, "GPU-a", 10, None, "L1", mps_client=False), ProcessUsage(2, "GPU-a", 10, None, "L1"))
    report = UsageReport(5.0, (), rows)
    assert UsageReport.from_dict(json.loads(json.dumps(report.to_dict()))).processes == rows


class FakeNvml:
    """NVML's answers for one GPU: the ordinary compute list and the MPS clients' list."""

    def __init__(self, running: List[Tuple[int, int]], clients: object) -> None:
        self.running, self.clients = running, clients

    @staticmethod
    def _procs(rows: List[Tuple[int, int]]) -> List[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=mib * 1024 * 1024) for pid, mib in rows]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> List[SimpleNamespace]:
        return self._procs(self.running)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: str) -> List[SimpleNamespace]:
        if not isinstance(self.clients, list):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return self._procs(self.clients)

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=0)

    def nvmlDeviceGetProcessUtilization(self, handle: str, since: int) -> List[object]:
        return []

    def nvmlShutdown(self) -> None:
        pass


@pytest.mark.parametrize("client_in_both_lists", [True, False])
def test_nvml_rows_say_which_process_is_an_mps_client(monkeypatch, client_in_both_lists):
    # 100: the MPS server (ordinary list only); 200: a client (in the MPS list, and in the ordinary
    # one too where the driver lists clients there); 300: a process that started outside MPS.
    running = [(100, 300), (300, 2048)] + ([(200, 1024)] if client_in_both_lists else [])
    monkeypatch.setattr(device_usage, "load_nvml", lambda: FakeNvml(running, [(200, 1024)]))
    sampler = UsageSampler([Device("GPU-real-0", 0, "H100", 80 * GIB)], "")
    _, rows = sampler.sample()
    assert sorted((p.pid, p.memory_mib, p.mps_client) for p in rows) == [
        (100, 300, False),
        (200, 1024, True),
        (300, 2048, False),
    ]
    monkeypatch.setattr(device_usage, "load_nvml", lambda: FakeNvml(running, None))
    _, rows = UsageSampler([Device("GPU-real-0", 0, "H100", 80 * GIB)], "").sample()
    assert {p.mps_client for p in rows} == {None}, "a driver that cannot say judges no process"


# --- end to end: a real server in mps mode, real `gpupool run`s --------------------------------


@pytest.fixture
def mps_server(server_factory, fake_mps, tmp_path, monkeypatch):
    usage = tmp_path / "usage.json"
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(usage))
    monkeypatch.setenv("FAKE_MPS_SERVER", "1")  # the stand-in daemon starts an "MPS server" child
    # A grace no test waits out: what is stopped here is stopped by the rule without one.
    server = server_factory("--isolation", "mps", "--enforce-grace", "600", "--usage-interval", "0.2")
    return server, usage, fake_mps


def _run(server, env: dict, record: Path, stop: Path) -> subprocess.Popen:
    return subprocess.Popen(
        CLI + ["run", "-q", "--server", server.url, "-p", "0.25", "--", sys.executable, HOLDER, str(record), str(stop)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _status(server) -> dict:
    return httpx.get(f"{server.url}/v1/status", headers=server.headers(), timeout=30).json()


def test_server_stops_a_run_outside_mps_and_its_lease_ends(mps_server, tmp_path):
    server, usage, record_dir = mps_server
    env = server.client_env(tmp_path)
    capped_record, uncapped_record = tmp_path / "capped.json", tmp_path / "uncapped.json"
    capped = _run(server, env, capped_record, tmp_path / "capped.stop")
    uncapped = None
    try:
        wait_until(capped_record.exists, 60, "the capped run's command to start")
        (capped_lease,) = _status(server)["leases"]
        uncapped = _run(server, env, uncapped_record, tmp_path / "never")
        wait_until(uncapped_record.exists, 60, "the uncapped run's command to start")
        status = _status(server)
        assert status["isolation"]["mode"] == "mps"
        (lease,) = [x for x in status["leases"] if x["id"] != capped_lease["id"]]
        capped_child = json.loads(capped_record.read_text())["pid"]
        uncapped_child = json.loads(uncapped_record.read_text())["pid"]
        mps_server_pid = int(wait_until(lambda: list(record_dir.glob("server-*.pid")), 30)[0].read_text())

        rows: dict = {}
        rows.setdefault(capped_lease["devices"][0]["uuid"], {})[capped_child] = UsageRow(GIB, mps_client=True)
        rows.setdefault(lease["devices"][0]["uuid"], {})[uncapped_child] = UsageRow(GIB, mps_client=False)
        other = next(d["uuid"] for d in status["devices"] if d["uuid"] not in rows) if len(rows) == 1 else None
        rows.setdefault(other or capped_lease["devices"][0]["uuid"], {})[mps_server_pid] = UsageRow(
            300, mps_client=False
        )
        write_usage(str(usage), rows)

        wait_until(lambda: not alive(uncapped_child), 60, "the process outside MPS to be stopped")
        assert uncapped.wait(timeout=60) == 128 + 15  # its command died of SIGTERM; the runner says so
        wait_until(lambda: lease["id"] not in {x["id"] for x in _status(server)["leases"]}, 60, "its lease to end")
        history = httpx.get(f"{server.url}/v1/history", headers=server.headers(), timeout=30).json()
        (ended,) = [r for r in history["leases"] if r["lease"] == lease["id"]]
        assert (ended["ended"], ended["exit_code"]) == ("released", 128 + 15)

        actions = wait_until(lambda: _status(server)["usage"]["actions"], 60, "the action in the usage record")
        assert [(a["reason"], a["mode"], a["pid"], a["lease_id"]) for a in actions] == [
            ("outside_mps", "kill", uncapped_child, lease["id"])
        ]
        log = server.log.read_text()
        (line,) = [x for x in log.splitlines() if "outside_mps" in x]
        assert f"pid {uncapped_child}" in line and lease["id"] in line

        # Samples go on; the MPS client and the MPS server are left alone by every one of them.
        seen = _status(server)["usage"]["sampled_at"]
        wait_until(lambda: _status(server)["usage"]["sampled_at"] > seen + 1, 60, "more samples")
        assert alive(capped_child) and alive(mps_server_pid) and len(_status(server)["usage"]["actions"]) == 1
        (tmp_path / "capped.stop").touch()
        assert capped.wait(timeout=60) == 0
    finally:
        for proc in (capped, uncapped):
            if proc is not None:
                proc.kill()
                proc.wait()
