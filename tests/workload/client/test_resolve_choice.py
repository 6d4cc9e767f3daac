"""Choosing among several pools: fits now > could ever fit (wait there) > unsatisfiable; filters; unreachable."""

from __future__ import annotations

import threading

import pytest
from envs import free_port

from gpupool.core.errors import InvalidClaim, Unavailable, Unsatisfiable
from gpupool.core.filters import Filter
from gpupool.core.model import Claim, Holder
from gpupool.pooling.devices import emulated_devices
from gpupool.workload.client.embedded import EmbeddedPoolClient
from gpupool.workload.client.http import HttpPoolClient
from gpupool.workload.client.resolve import choose_and_claim, connect_all, merged_status

ME = Holder("me", 1, "host")


def embedded(tmp_path, name, spec="emulated:1x16GiB"):
    return EmbeddedPoolClient(tmp_path / name, devices=emulated_devices(spec, node=name))


def test_first_pool_that_fits_now_wins(tmp_path):
    a, b = embedded(tmp_path, "poola"), embedded(tmp_path, "poolb")
    a.claim(Claim.single(1, memory_mib=12 * 1024), ME)
    client, lease = choose_and_claim([a, b], Claim.single(1, fraction=0.5), ME)
    assert client is b and lease.slices[0].device_uuid.startswith("GPU-emu-poolb")
    client, _ = choose_and_claim([a, b], Claim.single(1, fraction=0.25), ME)
    assert client is a  # fits on the first again


def test_server_addr_filter_chooses_the_server(tmp_path):
    a, b = embedded(tmp_path, "poola"), embedded(tmp_path, "poolb")
    claim = Claim.single(1, fraction=0.5, filters=[Filter.parse("server.addr=*poolb*")])
    client, _ = choose_and_claim([a, b], claim, ME)
    assert client is b
    with pytest.raises(InvalidClaim, match="no pool server matches server.addr=nowhere"):
        choose_and_claim([a, b], Claim.single(1, fraction=0.5, filters=[Filter.parse("server.addr=nowhere")]), ME)


def test_waits_on_the_first_pool_that_could_ever_hold_it(tmp_path):
    a, b = embedded(tmp_path, "poola", "emulated:1x8GiB"), embedded(tmp_path, "poolb")
    holder_lease = b.claim(Claim.single(1, fraction=1.0), ME)
    lines = []
    threading.Timer(0.4, lambda: b.release(holder_lease.id)).start()
    client, lease = choose_and_claim(
        [a, b], Claim.single(1, memory_mib=12 * 1024), ME, wait_s=10, progress=lines.append
    )
    assert client is b and lease.slices[0].memory_mib == 12 * 1024
    assert any("Waiting up to 10s in the queue of embedded:" in line for line in lines)


def test_no_wait_fails_fast_with_a_hint(tmp_path):
    a = embedded(tmp_path, "poola")
    a.claim(Claim.single(1, fraction=1.0), ME)
    with pytest.raises(Unavailable, match="--wait"):
        choose_and_claim([a], Claim.single(1, fraction=0.5), ME)


def test_never_fits_anywhere_is_unsatisfiable_with_each_reason(tmp_path):
    a, b = embedded(tmp_path, "poola"), embedded(tmp_path, "poolb")
    with pytest.raises(Unsatisfiable) as info:
        choose_and_claim([a, b], Claim.single(3, fraction=0.5), ME)
    assert "poola" in info.value.message and "poolb" in info.value.message
    assert info.value.exit_code == 2


def test_unreachable_servers_are_skipped_with_a_warning(tmp_path):
    dead = HttpPoolClient(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    a = embedded(tmp_path, "poola")
    lines = []
    client, _ = choose_and_claim([dead, a], Claim.single(1, fraction=0.5), ME, progress=lines.append)
    assert client is a
    assert any(line.startswith("warning: skipping " + dead.address) for line in lines)
    status = merged_status([dead, a], progress=lines.append)
    assert len(status.leases) == 1


def test_connect_all_reads_embedded_addresses_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPOOL_DEVICES", "emulated:1x4GiB")
    clients = connect_all([f"embedded:{tmp_path / 'x'}", "http://127.0.0.1:9"])
    assert [type(c).__name__ for c in clients] == ["EmbeddedPoolClient", "HttpPoolClient"]
    assert clients[0].status().devices[0].memory_mib == 4096
    monkeypatch.delenv("GPUPOOL_SERVER", raising=False)
    monkeypatch.setenv("GPUPOOL_CONFIG", str(tmp_path / "none" / "client.yaml"))
    monkeypatch.setenv("GPUPOOL_STATE", str(tmp_path / "state"))
    with pytest.raises(Exception, match="does not exist"):
        connect_all()
    monkeypatch.delenv("GPUPOOL_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (only,) = connect_all()
    assert only.address == f"embedded:{tmp_path / 'state'}"
