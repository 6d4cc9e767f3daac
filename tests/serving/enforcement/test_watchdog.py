"""The watchdog in process: a real pool on SQLite, the emulated usage file, real processes to attribute."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterable, List, Tuple

import pytest
from clock import FakeClock
from envs import write_usage
from waiting import wait_until

from gpupool.core.errors import InvalidInput
from gpupool.core.model import Claim, Holder
from gpupool.core.usage import EnforceMode, UsageReport, Violation
from gpupool.pooling.devices import emulated_devices
from gpupool.pooling.devices.usage import UsageSampler
from gpupool.pooling.isolation.emulated_usage import UsageRow, parse_usage
from gpupool.pooling.isolation.env import LEASE_ID_ENV
from gpupool.pooling.isolation.evidence import NodeView, Witness, start_ticks
from gpupool.pooling.pool import Pool
from gpupool.serving.enforcement import Attributor, Watchdog, WatchdogConfig
from gpupool.serving.enforcement.attest import Attestations

GIB = 1024


class Kills:
    """Records what the watchdog asked to terminate instead of killing (in-process tests)."""

    def __init__(self) -> None:
        self.calls: List[List[int]] = []

    def __call__(self, pids: Iterable[int], grace_s: float) -> List[int]:
        self.calls.append(list(pids))
        return []


@pytest.fixture
def pool(tmp_path: Path) -> Iterable[Pool]:
    p = Pool(tmp_path / "state", devices=emulated_devices("emulated:2x16GiB", "n1"))
    yield p
    p.close()


# What the node's attestation socket records (tests/serving/enforcement/test_attest_listener.py drives the
# socket itself); here the test process stands in for a runner that attested its lease.
ATTESTED = Attestations()


def watchdog(
    pool: Pool, usage_file: Path, clock: FakeClock, kills: Kills, attested: Attestations = ATTESTED, **config: object
) -> Watchdog:
    settings = {"interval_s": 1.0, "grace_s": 5.0}
    settings.update(config)
    return Watchdog(
        pool,
        WatchdogConfig(**settings),  # type: ignore[arg-type]
        sampler=UsageSampler(pool.devices(), str(usage_file)),
        attributor=Attributor(attested),
        clock=clock,
        terminate=kills,
    )


def own_lease(pool: Pool, fraction: float, pid: int) -> Tuple[str, str]:
    """A lease whose runner `pid` attested it (the node's record, as its socket makes it)."""
    lease = pool.claim(Claim.single(1, fraction=fraction), Holder("alice", pid, socket.gethostname()))
    ticks = start_ticks(pid)
    assert ticks is not None
    ATTESTED.add(lease.id, Witness(pid, ticks, os.getuid()))
    return lease.id, lease.slices[0].device_uuid


def test_over_share_is_acted_on_after_the_grace_period_only(pool, tmp_path, child):
    clock, kills, usage = FakeClock(), Kills(), tmp_path / "usage.json"
    lease_id, uuid = own_lease(pool, 0.25, os.getpid())  # 4 GiB; the child is a descendant of the holder
    dog = watchdog(pool, usage, clock, kills)
    write_usage(usage, {uuid: {child.pid: 8 * GIB}})
    report = dog.step()
    assert [(p.pid, p.lease_id, p.memory_mib) for p in report.processes] == [(child.pid, lease_id, 8 * GIB)]
    assert report.device(uuid).memory_used_mib == 8 * GIB and not kills.calls
    clock.now += 4.9
    assert not dog.step().actions and not kills.calls
    clock.now += 0.2
    report = dog.step()
    assert kills.calls == [[child.pid]]
    (action,) = report.actions
    assert (action.reason, action.mode, action.lease_id, action.pid) == (
        Violation.OVER_SHARE,
        EnforceMode.KILL,
        lease_id,
        child.pid,
    )
    assert report.actions_total == {"over_share": 1, "unleased": 0, "outside_mps": 0}
    clock.now += 1
    dog.step()
    assert len(kills.calls) == 1, "one action per violation, not one per sample"
    # The pool holds the record that every view reads.
    assert pool.status().usage.actions_total["over_share"] == 1


def test_within_share_and_back_under_resets_the_grace(pool, tmp_path, child):
    clock, kills, usage = FakeClock(), Kills(), tmp_path / "usage.json"
    lease_id, uuid = own_lease(pool, 0.5, os.getpid())  # 8 GiB
    dog = watchdog(pool, usage, clock, kills)
    write_usage(usage, {uuid: {child.pid: 8 * GIB}})  # exactly the share: fine
    clock.now += 10
    dog.step()
    write_usage(usage, {uuid: {child.pid: 9 * GIB}})
    dog.step()
    clock.now += 3
    write_usage(usage, {uuid: {child.pid: 7 * GIB}})
    dog.step()
    clock.now += 3
    write_usage(usage, {uuid: {child.pid: 9 * GIB}})
    dog.step()
    assert not kills.calls, "the grace period starts again after the lease went back under its share"
    assert pool.status().usage.lease_memory_mib() == {lease_id: 9 * GIB}


def test_warn_mode_counts_but_kills_nothing_and_off_does_not_count(pool, tmp_path, child):
    clock, kills, usage = FakeClock(), Kills(), tmp_path / "usage.json"
    _, uuid = own_lease(pool, 0.25, os.getpid())
    write_usage(usage, {uuid: {child.pid: 8 * GIB}})
    warn = watchdog(pool, usage, clock, kills, over_share=EnforceMode.WARN, grace_s=0.0)
    report = warn.step()
    assert not kills.calls and report.actions[0].mode is EnforceMode.WARN and report.actions_total["over_share"] == 1
    off = watchdog(pool, usage, clock, kills, over_share=EnforceMode.OFF, grace_s=0.0)
    assert off.step().actions_total["over_share"] == 0 and not kills.calls


def test_unleased_process_is_listed_and_killed_only_in_kill_mode(pool, tmp_path, child):
    clock, kills, usage = FakeClock(), Kills(), tmp_path / "usage.json"
    uuid = pool.devices()[1].uuid
    write_usage(usage, {uuid: {child.pid: 1 * GIB}})  # no lease at all
    default = watchdog(pool, usage, clock, kills, grace_s=0.0)  # unleased: warn by default
    report = default.step()
    assert [p.pid for p in report.unleased()] == [child.pid]
    assert report.actions[0].reason is Violation.UNLEASED and not kills.calls
    strict = watchdog(pool, usage, clock, kills, grace_s=0.0, unleased=EnforceMode.KILL)
    strict.step()
    assert kills.calls == [[child.pid]]


def test_the_lease_id_in_the_env_alone_attributes_nothing(pool, tmp_path):
    # Any process can set GPUPOOL_LEASE_ID: off every attested tree it is a hint, never evidence.
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice", os.getpid(), socket.gethostname()))
    lease_id, uuid = lease.id, lease.slices[0].device_uuid  # not attested: the holder pid is a label
    env = dict(os.environ, **{LEASE_ID_ENV: lease_id})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    stranger = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env=dict(os.environ, **{LEASE_ID_ENV: "not-a-live-lease"}),
    )
    try:
        usage = tmp_path / "usage.json"
        write_usage(usage, {uuid: {proc.pid: GIB, stranger.pid: GIB}})
        for pid in (proc.pid, stranger.pid):  # the children have exec'd: their environ is the one given
            wait_until(lambda pid=pid: LEASE_ID_ENV.encode() in Path(f"/proc/{pid}/environ").read_bytes(), 10)
        report = watchdog(pool, usage, FakeClock(), Kills()).step()
        owners = {p.pid: p.lease_id for p in report.processes}
        assert owners == {proc.pid: "", stranger.pid: ""}
    finally:
        for p in (proc, stranger):
            p.kill()
            p.wait()


def test_a_pod_process_is_attributed_by_the_cgroup_of_an_attested_runner(pool, tmp_path):
    uid, other = "0b9d6c2a-7a51-4c4e-9a0c-2f1f7a5d9e11", "1c9d6c2a-7a51-4c4e-9a0c-2f1f7a5d9e22"
    pods = {4242: uid, 4343: other, 4444: uid}
    # The claim's label names the other pod: a label, never read.
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("team", 7, "pod-host", f"pod:ns/train:{other}"))
    attested = Attestations()
    attested.add(lease.id, Witness(os.getpid(), start_ticks(os.getpid()) or 0, os.getuid(), uid))
    envs = {4444: "not-this-lease"}
    attributor = Attributor(attested, lambda: NodeView(pod_of=pods.get, lease_env_of=envs.get))
    uuid = lease.slices[0].device_uuid
    rows = attributor.attribute([_row(4242, uuid), _row(4343, uuid), _row(4444, uuid)], pool.status().leases)
    assert [(r.pid, r.lease_id) for r in rows] == [(4242, lease.id), (4343, ""), (4444, lease.id)]

    # Two leases attested from one pod: the env chooses between them, and only between them.
    second = pool.claim(Claim.single(1, fraction=0.25), Holder("team", 8, "pod-host"))
    attested.add(second.id, Witness(os.getppid(), start_ticks(os.getppid()) or 0, os.getuid(), uid))
    envs.update({4242: second.id, 4343: second.id})
    rows = attributor.attribute([_row(4242, uuid), _row(4343, uuid), _row(4444, uuid)], pool.status().leases)
    assert [(r.pid, r.lease_id) for r in rows] == [(4242, second.id), (4343, ""), (4444, "")]


def test_a_reused_pid_and_a_released_lease_lose_their_attestation(pool, tmp_path, child):
    lease = pool.claim(Claim.single(1, fraction=0.5), Holder("alice", child.pid, socket.gethostname()))
    uuid = lease.slices[0].device_uuid
    attested = Attestations()
    ticks = start_ticks(child.pid) or 0
    attested.add(lease.id, Witness(child.pid, ticks - 1, os.getuid()))  # another process once had this pid
    rows = Attributor(attested).attribute([_row(child.pid, uuid)], pool.status().leases)
    assert rows[0].lease_id == ""
    attested.add(lease.id, Witness(child.pid, ticks, os.getuid()))
    assert Attributor(attested).attribute([_row(child.pid, uuid)], pool.status().leases)[0].lease_id == lease.id
    pool.release(lease.id)
    assert Attributor(attested).attribute([_row(child.pid, uuid)], pool.status().leases)[0].lease_id == ""
    assert attested.current({lease.id}) == {}, "the records end with their lease"


def _row(pid: int, uuid: str):
    from gpupool.core.usage import ProcessUsage

    return ProcessUsage(pid, uuid, 100)


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2]",
        '{"GPU-x": [1]}',
        '{"GPU-x": {"abc": 1}}',
        '{"GPU-x": {"1": -5}}',
        '{"GPU-x": {"1": NaN}}',
        '{"GPU-x": {"1": Infinity}}',
        '{"GPU-x": {"1": 1e400}}',
        '{"GPU-x": {"1": true}}',
        "{" * 100_000,
        "not json",
    ],
)
def test_a_damaged_usage_file_counts_as_empty_with_one_warning(pool, tmp_path, text, caplog):
    usage = tmp_path / "usage.json"
    usage.write_text(text)
    sampler = UsageSampler(pool.devices(), str(usage))
    devices, processes = sampler.sample()
    assert processes == () and all(d.memory_used_mib == 0 for d in devices)
    sampler.sample()
    warnings = [r for r in caplog.records if "GPUPOOL_EMULATED_USAGE" in r.getMessage()]
    assert len(warnings) == 1 and str(usage) in warnings[0].getMessage()


def test_a_huge_usage_file_is_not_read_whole(pool, tmp_path):
    usage = tmp_path / "usage.json"
    with open(usage, "w") as handle:
        handle.write('{"GPU-x": {' + ",".join(f'"{i}": 1' for i in range(1, 200_000)) + "}}")
    assert UsageSampler(pool.devices(), str(usage)).sample()[1] == ()


def test_parse_usage_accepts_the_documented_shape():
    assert parse_usage({"GPU-a": {"12": 100, "13": 2.5}, "GPU-b": {}}) == {
        "GPU-a": {12: UsageRow(100), 13: UsageRow(2)},
        "GPU-b": {},
    }
    assert parse_usage({"GPU-a": {"12": {"memory_mib": 100, "utilization": 0}}}) == {"GPU-a": {12: UsageRow(100, 0.0)}}


def test_usage_record_survives_the_wire_and_merges():
    report = UsageReport.from_dict(json.loads(json.dumps(_sample_report().to_dict())))
    assert report == _sample_report()
    merged = UsageReport.merge([report, report])
    assert merged.actions_total == {"over_share": 2, "unleased": 0, "outside_mps": 0} and len(merged.processes) == 2


def _sample_report() -> UsageReport:
    from gpupool.core.usage import DeviceUsage, EnforcementAction, ProcessUsage

    return UsageReport(
        5.0,
        (DeviceUsage("GPU-a", 10, 0.5),),
        (ProcessUsage(1, "GPU-a", 10, None, "L1"),),
        (EnforcementAction(4.0, Violation.OVER_SHARE, EnforceMode.KILL, 1, "GPU-a", 10, "L1", "alice"),),
        {"over_share": 1, "unleased": 0, "outside_mps": 0},
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("interval_s", 0.0),
        ("interval_s", float("nan")),
        ("grace_s", -1.0),
        ("grace_s", float("inf")),
        ("interval_s", 1e9),
    ],
)
def test_bad_watchdog_settings_are_refused_with_the_flag_named(field, value):
    with pytest.raises(InvalidInput) as err:
        WatchdogConfig(**{field: value})  # type: ignore[arg-type]
    assert "--usage-interval" in err.value.message or "--enforce-grace" in err.value.message


def test_real_kill_escalates_for_a_process_that_ignores_sigterm(pool, tmp_path):
    """The default terminate: SIGTERM, then SIGKILL after the short grace."""
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        usage = tmp_path / "usage.json"
        write_usage(usage, {pool.devices()[0].uuid: {stubborn.pid: GIB}})
        dog = Watchdog(
            pool,
            WatchdogConfig(grace_s=0.0, unleased=EnforceMode.KILL, term_grace_s=0.3),
            sampler=UsageSampler(pool.devices(), str(usage)),
        )
        dog.step()
        assert stubborn.wait(timeout=60) == -signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait()
