"""The node's own MPS infrastructure is never "unleased": the MPS server below the control daemon that
the server supervises (or adopted after a kill -9) holds GPU memory and belongs to no lease, yet the
watchdog's unleased rule in kill mode leaves it alone, sample after sample past the grace. What makes
a process the node's is the kernel's process table (it descends from the daemon, named by its pid and
start time), never its name: another user's process named nvidia-cuda-mps-server is still killed.
Real processes, the stand-in daemon, the emulated usage file, real servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from clock import FakeClock
from waiting import wait_until

from gpupool.core.usage import EnforceMode, Violation
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.devices.usage import EMULATED_USAGE_ENV, UsageSampler
from gpupool.pooling.isolation.emulated_usage import UsageRow, write_usage
from gpupool.pooling.isolation.evidence import NodeView, start_ticks
from gpupool.pooling.isolation.mps import MpsDaemon
from gpupool.pooling.isolation.proctree import alive
from gpupool.pooling.pool import Pool
from gpupool.serving.enforcement import Attributor, Watchdog, WatchdogConfig
from gpupool.serving.enforcement.attest import Attestations
from tests.serving.enforcement.test_watchdog import Kills

OTHER_UID = 60003  # a local user who names a process like the MPS server
MPS_SERVER_NAME = "nvidia-cuda-mps-server"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starts a process of another local user: needs root")


def impostor() -> subprocess.Popen:
    """A process of OTHER_UID named nvidia-cuda-mps-server (argv[0] and comm), no kin of any daemon."""
    # comm is written before setuid: after it, /proc/self belongs to root (the process is not dumpable).
    code = (
        f"import os, time; open('/proc/self/comm', 'w').write({MPS_SERVER_NAME!r}); os.setgroups([]); "
        f"os.setgid({OTHER_UID}); os.setuid({OTHER_UID}); time.sleep(300)"
    )
    proc = subprocess.Popen([MPS_SERVER_NAME, "-c", code], executable=sys.executable)
    wait_until(lambda: os.stat(f"/proc/{proc.pid}").st_uid == OTHER_UID, 30, "the impostor to be another user")
    with open(f"/proc/{proc.pid}/cmdline", "rb") as handle:
        assert handle.read().split(b"\0")[0] == MPS_SERVER_NAME.encode()
    return proc


def mps_server_of(record: Path) -> int:
    """The pid of the stand-in daemon's "MPS server" child (FAKE_MPS_SERVER=1)."""
    return int(wait_until(lambda: list(record.glob("server-*.pid")), 30, "the MPS server's pid")[0].read_text())


# --- attribution, in process ---------------------------------------------------------------------


@needs_root
def test_only_the_supervised_daemons_descendants_are_infrastructure(fake_mps, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_SERVER", "1")
    pool = Pool(tmp_path / "state", devices=emulated_devices("emulated:2x16GiB", "n1"))
    daemon = MpsDaemon(tmp_path / "state")
    fake = impostor()
    try:
        pool.set_isolation(daemon.start())
        identity = daemon.identity()
        assert identity is not None and identity == (daemon.pid, start_ticks(identity[0]))
        server = mps_server_of(fake_mps)
        uuid = pool.devices()[0].uuid
        usage, clock, kills = tmp_path / "usage.json", FakeClock(), Kills()
        write_usage(usage, {uuid: {server: UsageRow(300, mps_client=False), fake.pid: UsageRow(512)}})
        dog = Watchdog(
            pool,
            WatchdogConfig(interval_s=1.0, grace_s=2.0, unleased=EnforceMode.KILL),
            sampler=UsageSampler(pool.devices(), str(usage)),
            attributor=Attributor(Attestations(), mps_daemon=daemon.identity),
            clock=clock,
            terminate=kills,
        )
        for _ in range(6):  # well past the grace
            report = dog.step()
            clock.now += 1
        assert kills.calls == [[fake.pid]], "the impostor alone, once"
        assert [(a.reason, a.pid) for a in report.actions] == [(Violation.UNLEASED, fake.pid)]
        rows = {p.pid: p for p in report.processes}
        assert rows[server].infrastructure and not rows[server].unleased and rows[server].lease_id == ""
        assert rows[fake.pid].unleased and not rows[fake.pid].infrastructure
        assert [p.pid for p in report.unleased()] == [fake.pid]
        # The same pid with another start time (a reused pid) names no daemon: its kin is no one's.
        view = NodeView()
        assert view.descends_from(server, *identity) and not view.descends_from(server, identity[0], identity[1] + 1)
        reused = Attributor(Attestations(), mps_daemon=lambda: (identity[0], identity[1] + 1))
        assert not any(p.infrastructure for p in reused.attribute(report.processes, []))
        daemon.stop()
        assert daemon.identity() is None
    finally:
        daemon.stop()
        fake.kill()
        fake.wait()
        pool.close()


# --- end to end: real servers in mps mode with --enforce-unleased kill ----------------------------


def _status(server) -> dict:
    return httpx.get(f"{server.url}/v1/status", headers=server.headers(), timeout=30).json()


def _server(server_factory, state: Path):
    return server_factory(
        "--isolation",
        "mps",
        "--enforce-unleased",
        "kill",
        "--enforce-grace",
        "0.5",
        "--usage-interval",
        "0.2",
        state=state,
    )


def _several_samples_later(server, seconds: float = 3.0) -> dict:
    seen = wait_until(lambda: _status(server)["usage"], 60, "a sample")["sampled_at"]
    return wait_until(
        lambda: (lambda u: u if u["sampled_at"] > seen + seconds else None)(_status(server)["usage"]),
        90,
        f"samples over {seconds:g} s more",
    )


@needs_root
def test_a_server_spares_its_mps_server_and_kills_an_impostor(fake_mps, server_factory, tmp_path, monkeypatch):
    usage = tmp_path / "usage.json"
    write_usage(usage, {})
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(usage))
    monkeypatch.setenv("FAKE_MPS_SERVER", "1")
    server = _server(server_factory, tmp_path / "state")
    mps_server = mps_server_of(fake_mps)
    fake = impostor()
    try:
        uuid = _status(server)["devices"][0]["uuid"]
        write_usage(
            usage,
            {uuid: {mps_server: UsageRow(300, mps_client=False), fake.pid: UsageRow(512, mps_client=False)}},
        )
        wait_until(lambda: not alive(fake.pid), 60, "the impostor to be killed as unleased")
        sample = _several_samples_later(server)
        assert alive(mps_server), "the node's MPS server outlived many samples past the grace"
        assert [(a["reason"], a["mode"], a["pid"]) for a in sample["actions"]] == [("unleased", "kill", fake.pid)]
        rows = {p["pid"]: p for p in sample["processes"]}
        assert rows[mps_server]["infrastructure"] is True and rows[mps_server]["lease_id"] == ""
        assert rows[fake.pid]["infrastructure"] is False
        # `gpupool status` lists the impostor's row (the usage file still has it) as unleased, not the MPS server.
        cli = [sys.executable, "-m", "gpupool.cli.workload", "status", "--server", server.url]
        table = subprocess.run(cli, env=server.client_env(tmp_path), capture_output=True, text=True, timeout=120)
        assert table.returncode == 0, table.stderr
        listed = table.stdout.split("UNLEASED PID", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
        assert [int(x.split()[0]) for x in listed if x.strip() and x.split()[0].isdigit()] == [fake.pid], table.stdout
        line = wait_until(
            lambda: [x for x in server.log.read_text().splitlines() if f"killed pid {fake.pid} " in x], 30, "its line"
        )[0]
        assert f"runs as uid {OTHER_UID}" in line or "unknown uid" in line, line
        named = [x for x in server.log.read_text().splitlines() if " watchdog " in x and f"pid {mps_server} " in x]
        assert named == [], "no watchdog line names the MPS server"
    finally:
        fake.kill()
        fake.wait()
        assert server.stop() == 0  # it quits its daemon, which takes its MPS server along
    wait_until(lambda: not alive(mps_server), 30, "the MPS server's end with its server")


def test_a_server_spares_the_mps_server_of_a_daemon_it_adopted(fake_mps, server_factory, tmp_path, monkeypatch):
    usage = tmp_path / "usage.json"
    write_usage(usage, {})
    monkeypatch.setenv(EMULATED_USAGE_ENV, str(usage))
    monkeypatch.setenv("FAKE_MPS_SERVER", "1")
    state = tmp_path / "state"
    first = _server(server_factory, state)
    mps_server = mps_server_of(fake_mps)
    first.stop(signal.SIGKILL)  # its daemon (own session) and the daemon's MPS server stay
    assert alive(mps_server)
    second = _server(server_factory, state)  # adopts the daemon
    write_usage(usage, {_status(second)["devices"][0]["uuid"]: {mps_server: UsageRow(300, mps_client=False)}})
    sample = _several_samples_later(second)
    assert alive(mps_server) and sample["actions"] == []
    assert [(p["pid"], p["infrastructure"]) for p in sample["processes"]] == [(mps_server, True)]
    assert second.stop() == 0
    wait_until(lambda: not alive(mps_server), 30, "the MPS server's end with the daemon its server quit")
