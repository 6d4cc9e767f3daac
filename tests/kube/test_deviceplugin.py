"""Device plugin against a kubelet stand-in over real gRPC on unix sockets."""

from __future__ import annotations

import os
import time

import grpc
import pytest
from waiting import wait_until

from gpupool.core.model import Device
from gpupool.kube.deviceplugin import api_pb2 as pb
from gpupool.kube.deviceplugin import api_pb2_grpc as rpc
from gpupool.kube.deviceplugin.plugin import DevicePlugin, PluginConfig
from gpupool.kube.deviceplugin.units import gpu_key, preferred_units, unit_ids

from .conftest import Kubelet

DEVICES = [
    Device("GPU-emu-node-0", 0, "Emulated GPU 16GiB", 16384, "node"),
    Device("GPU-emu-node-1", 1, "Emulated GPU 16GiB", 16384, "node"),
]


@pytest.fixture
def kubelet_dir(tmp_path):
    d = tmp_path / "dp"
    d.mkdir()
    return str(d)


@pytest.fixture
def plugin(kubelet_dir):
    p = DevicePlugin(
        DEVICES,
        PluginConfig(
            kubelet_dir=kubelet_dir,
            agent_url="http://10.0.0.5:56001",
            watch_interval_s=0.1,
            mounts=[("/var/run/host", kubelet_dir, True), ("/nope", "/does/not/exist", True)],
        ),
    )
    yield p
    p.stop()


def stub(plugin):
    channel = grpc.insecure_channel(f"unix://{plugin.socket_path}")
    return channel, rpc.DevicePluginStub(channel)


def test_registers_streams_units_and_allocates(kubelet_dir, plugin):
    kubelet = Kubelet(kubelet_dir)
    try:
        plugin.start()
        req = kubelet.requests.get(timeout=30)
        assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "gpupool.sock", "gpupool.io/gpu")
        channel, dp = stub(plugin)
        with channel:
            assert not dp.GetDevicePluginOptions(pb.Empty(), timeout=30).pre_start_required
            stream = dp.ListAndWatch(pb.Empty(), timeout=10)
            first = next(stream)
            assert len(first.devices) == 200
            assert all(d.health == "Healthy" and len(d.ID) <= 63 for d in first.devices)
            assert len({d.ID for d in first.devices}) == 200
            # An XID on GPU 1: its 100 units turn unhealthy in the stream.
            plugin.set_unhealthy({"GPU-emu-node-1"})
            second = next(stream)
            bad = [d.ID for d in second.devices if d.health == "Unhealthy"]
            assert len(bad) == 100 and all(i.startswith(gpu_key("GPU-emu-node-1")) for i in bad)
            stream.cancel()

            ids = [d.ID for d in first.devices[:50]]
            resp = dp.Allocate(
                pb.AllocateRequest(
                    container_requests=[
                        pb.ContainerAllocateRequest(devices_ids=ids),
                        pb.ContainerAllocateRequest(devices_ids=ids[:5]),
                    ]
                ),
                timeout=5,
            )
            a, b = resp.container_responses
            assert a.envs["GPUPOOL_SERVER"] == "http://10.0.0.5:56001"
            assert a.envs["GPUPOOL_UNITS"] == "50" and b.envs["GPUPOOL_UNITS"] == "5"
            assert [(m.container_path, m.read_only) for m in a.mounts] == [("/var/run/host", True)]
            with pytest.raises(grpc.RpcError) as err:
                dp.Allocate(
                    pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-nope-00"])]),
                    timeout=5,
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        kubelet.stop()


def test_reregisters_when_the_kubelet_restarts(kubelet_dir, plugin):
    kubelet = Kubelet(kubelet_dir)
    plugin.start()
    kubelet.requests.get(timeout=30)
    # The kubelet restarts: its socket goes away, and it wipes the plugin sockets.
    kubelet.stop()
    os.unlink(plugin.socket_path)
    time.sleep(0.3)  # the kubelet away a while, as a restart is
    kubelet = Kubelet(kubelet_dir)
    try:
        again = kubelet.requests.get(timeout=30)
        assert again.resource_name == "gpupool.io/gpu"
        wait_until(
            lambda: plugin.registrations >= 2 and os.path.exists(plugin.socket_path), 30, "the plugin to register again"
        )
        channel, dp = stub(plugin)
        with channel:
            assert len(next(dp.ListAndWatch(pb.Empty(), timeout=30)).devices) == 200
    finally:
        kubelet.stop()


def test_starts_before_the_kubelet_and_registers_when_it_appears(kubelet_dir, plugin):
    plugin.start()  # no kubelet yet: must not block or fail
    assert plugin.registrations == 0
    kubelet = Kubelet(kubelet_dir)
    try:
        assert kubelet.requests.get(timeout=30).endpoint == "gpupool.sock"
    finally:
        kubelet.stop()


def test_long_device_ids_are_shortened():
    long_uuid = "GPU-emu-" + "n" * 70 + "-0"
    assert len(gpu_key(long_uuid)) + 3 <= 63
    assert gpu_key("GPU-fef8089b-4820-abfc-e83e-94318197576e") == "GPU-fef8089b-4820-abfc-e83e-94318197576e"


def test_preferred_units_follow_the_pools_choice():
    devices = [Device(f"GPU-{i}", i, "A100", 40960, "n") for i in range(3)]
    table = dict(unit_ids(devices))
    by_gpu = {d.uuid: [u for u, dev in table.items() if dev.uuid == d.uuid] for d in devices}
    # GPU-0 all free, GPU-1 60 units free, GPU-2 30 units free
    available = by_gpu["GPU-0"] + by_gpu["GPU-1"][:60] + by_gpu["GPU-2"][:30]
    half = preferred_units(available, [], 50, table)
    assert len(half) == 50 and {table[u].uuid for u in half} == {"GPU-1"}  # the fullest GPU that holds 50
    assert {table[u].uuid for u in preferred_units(available, [], 100, table)} == {"GPU-0"}  # a whole GPU
    must = by_gpu["GPU-2"][:2]
    kept = preferred_units(available, must, 30, table)
    assert kept[:2] == must and len(kept) == 30 and len(set(kept)) == 30
    # 150 units fit no single GPU and are not whole GPUs: the fullest GPUs' units first
    spread = preferred_units(available, [], 150, table)
    assert len(spread) == 150 and len(set(spread)) == 150


def test_get_preferred_allocation_over_grpc(kubelet_dir, plugin):
    kubelet = Kubelet(kubelet_dir)
    try:
        plugin.start()
        kubelet.requests.get(timeout=30)
        channel, dp = stub(plugin)
        with channel:
            assert dp.GetDevicePluginOptions(pb.Empty(), timeout=30).get_preferred_allocation_available
            ids = [u for u, _ in plugin.units]
            resp = dp.GetPreferredAllocation(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=ids[30:], allocation_size=25)
                    ]
                ),
                timeout=5,
            )
            (answer,) = resp.container_responses
            # GPU 0 has 70 units free, GPU 1 all 100: a quarter goes on the fuller GPU 0
            assert len(answer.deviceIDs) == 25 and set(answer.deviceIDs) <= set(ids[30:100])
    finally:
        kubelet.stop()
