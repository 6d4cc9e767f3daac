"""The DRA plugin on its real protocol: a kubelet stand-in registers it and calls
NodePrepareResources / NodeUnprepareResources over its Unix sockets; the API server is a local
HTTP stand-in serving ResourceClaims and recording the ResourceSlice writes."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from gpupool.core.usage import ProcessUsage
from gpupool.kube.apiclient import KubeApi
from gpupool.kube.dra.plugin import DraConfig, DraPlugin
from gpupool.kube.dra.prepare import claim_uid_of_label
from gpupool.pooling.devices import discover
from gpupool.pooling.isolation.env import LEASE_ID_ENV, MEMORY_LIMIT_ENV
from gpupool.pooling.isolation.evidence import NodeView, Witness
from gpupool.pooling.pool import Pool
from gpupool.serving.enforcement.attest import node_attestations
from gpupool.serving.enforcement.attribution import Attributor

from .dra_stand_ins import DRIVER, ApiServer, Kubelet, resource_claim, result

NS = "team-a"
UID = "6a1f7c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
CLAIM = (NS, UID, "trainer-gpu")


@pytest.fixture
def node(tmp_path):
    """API server, the node's pool (2 emulated 16 GiB GPUs), the plugin, the kubelet: torn down in reverse."""
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # Unix socket paths must stay short
    (tmp_path / "kubelet").symlink_to(root)
    api = ApiServer()
    pool = Pool(tmp_path / "state", devices=discover("emulated:2x16GiB", "node-a"), node="node-a")
    config = DraConfig(
        kubelet_dir=str(root / "device-plugins"),
        cdi_dir=str(tmp_path / "cdi"),
        state_dir=str(tmp_path / "state"),
        node="node-a",
    )
    plugin = DraPlugin(pool, KubeApi.at(api.url), config)
    plugin.start()
    kubelet = Kubelet()
    yield api, pool, plugin, kubelet, tmp_path
    kubelet.close()
    plugin.stop()
    pool.close()
    api.stop()
    shutil.rmtree(root)


def dra_leases(pool: Pool, uid: str = UID) -> list:
    return [lease for lease in pool.status().leases if claim_uid_of_label(lease.holder.label) == uid]


def cdi_env(cdi_dir: Path, cdi_id: str) -> dict:
    """The env a runtime would give a container handed `cdi_id`, read from the CDI spec files."""
    kind, name = cdi_id.split("=")
    for path in cdi_dir.glob("*.json"):
        spec = json.loads(path.read_text())
        if spec["kind"] != kind:
            continue
        for device in spec["devices"]:
            if device["name"] == name:
                return dict(e.split("=", 1) for e in device["containerEdits"]["env"])
    raise AssertionError(f"no CDI device {cdi_id} in {cdi_dir}")


def test_registers_as_a_dra_plugin_at_the_kubelets_paths(node):
    api, pool, plugin, kubelet, base = node
    root = (base / "kubelet").resolve()
    info = kubelet.register(str(root / "plugins_registry" / f"{DRIVER}-reg.sock"))
    assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", DRIVER, ["v1.DRAPlugin"])
    assert info.endpoint == str(root / "plugins" / DRIVER / "dra.sock")
    assert plugin.registration.registered.is_set()


def test_prepare_8gib_share_gives_cdi_ids_a_lease_and_unprepare_removes_both(node):
    api, pool, plugin, kubelet, base = node
    api.add_claim(resource_claim(NS, "trainer-gpu", UID, [result("gpu-0", "8Gi")]))
    kubelet.register(plugin.registration_socket)

    answer = kubelet.prepare(CLAIM).claims[UID]
    assert answer.error == ""
    [device] = answer.devices
    assert (list(device.request_names), device.pool_name, device.device_name) == (["gpu"], "node-a", "gpu-0")
    [cdi_id] = device.cdi_device_ids
    assert cdi_id == f"{DRIVER}/gpu={UID}-0"
    gpu0 = next(d for d in pool.devices() if d.index == 0)
    env = cdi_env(base / "cdi", cdi_id)
    assert env["CUDA_VISIBLE_DEVICES"] == gpu0.uuid
    assert env[MEMORY_LIMIT_ENV] == "8192"
    [lease] = dra_leases(pool)
    assert env[LEASE_ID_ENV] == lease.id
    assert [(s.device_uuid, s.memory_mib) for s in lease.slices] == [(gpu0.uuid, 8192)]

    assert kubelet.unprepare(CLAIM).claims[UID].error == ""
    assert dra_leases(pool) == []
    assert list((base / "cdi").glob("*.json")) == []
    assert kubelet.unprepare(CLAIM).claims[UID].error == ""  # again: still fine


def test_the_pods_a_claim_is_reserved_for_are_the_leases_evidence(node):
    """No runner attests in a DRA container: the node records the claim's pods (status.reservedFor)
    and its watchdog attributes their processes (kubepods cgroup) to the lease, no one else's."""
    api, pool, plugin, kubelet, base = node
    api.add_claim(resource_claim(NS, "trainer-gpu", UID, [result("gpu-0", "8Gi")]))
    kubelet.register(plugin.registration_socket)
    assert kubelet.prepare(CLAIM).claims[UID].error == ""
    [lease] = dra_leases(pool)
    pod = "9d0c1b7a-0000-4000-8000-000000000001"  # the stand-in claim's reservedFor
    evidence = node_attestations(pool.state_dir)
    assert evidence.current({lease.id}) == {lease.id: [Witness(0, 0, -1, pod)]}
    # Its pod's processes count against it; another pod's carrying the lease id in its env do not.
    pods, envs = {4242: pod, 4343: "1c9d6c2a-7a51-4c4e-9a0c-2f1f7a5d9e22"}, {4343: lease.id}
    attributor = Attributor(evidence, lambda: NodeView(pod_of=pods.get, lease_env_of=envs.get))
    rows = attributor.attribute([ProcessUsage(pid, lease.slices[0].device_uuid, 100) for pid in pods], [lease])
    assert [(r.pid, r.lease_id) for r in rows] == [(4242, lease.id), (4343, "")]
    assert kubelet.unprepare(CLAIM).claims[UID].error == ""
    assert evidence.current({live.id for live in pool.status().leases}) == {}, "the records end with their lease"


def test_preparing_twice_gives_the_same_answer_and_one_lease(node):
    api, pool, plugin, kubelet, base = node
    api.add_claim(resource_claim(NS, "trainer-gpu", UID, [result("gpu-1", "4Gi")]))
    kubelet.register(plugin.registration_socket)
    first = kubelet.prepare(CLAIM).claims[UID]
    second = kubelet.prepare(CLAIM).claims[UID]
    assert first.error == "" and first == second
    assert len(dra_leases(pool)) == 1


def test_a_claim_the_node_cannot_honour_fails_alone(node):
    api, pool, plugin, kubelet, base = node
    good, unknown, too_big = UID, "uid-unknown-device", "uid-too-big"
    api.add_claim(resource_claim(NS, "ok", good, [result("gpu-0", "8Gi")]))
    api.add_claim(resource_claim(NS, "unknown", unknown, [result("gpu-7", "8Gi")]))
    api.add_claim(resource_claim(NS, "big", too_big, [result("gpu-0", "12Gi")]))  # 8 of 16 GiB are taken
    api.add_claim(resource_claim(NS, "unplaced", "uid-unallocated", None))
    kubelet.register(plugin.registration_socket)
    answer = kubelet.prepare(
        (NS, good, "ok"),
        (NS, unknown, "unknown"),
        (NS, too_big, "big"),
        (NS, "uid-unallocated", "unplaced"),
        (NS, "uid-missing", "missing"),
    ).claims
    assert answer[good].error == "" and len(answer[good].devices) == 1
    assert "unknown device(s) gpu-7" in answer[unknown].error
    assert "no room now" in answer[too_big].error
    assert "not allocated" in answer["uid-unallocated"].error
    assert "not found" in answer["uid-missing"].error
    assert [claim_uid_of_label(lease.holder.label) for lease in pool.status().leases] == [good]


def test_a_whole_gpu_without_consumed_capacity_takes_all_of_it(node):
    api, pool, plugin, kubelet, base = node
    api.add_claim(resource_claim(NS, "whole", UID, [result("gpu-1", None)]))
    kubelet.register(plugin.registration_socket)
    [device] = kubelet.prepare((NS, UID, "whole")).claims[UID].devices
    assert cdi_env(base / "cdi", device.cdi_device_ids[0])[MEMORY_LIMIT_ENV] == "16384"


def test_published_slice_offers_each_gpu_as_consumable_memory(node):
    api, pool, plugin, kubelet, base = node
    [(verb, body)] = api.slice_writes
    assert verb == "POST"
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]) == (
        DRIVER,
        "node-a",
        {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
    )
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    gpu0 = spec["devices"][0]
    assert gpu0["allowMultipleAllocations"] is True
    assert gpu0["capacity"]["memory"]["value"] == "16384Mi"
    assert gpu0["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "256Mi", "step": "256Mi"}
    assert gpu0["attributes"]["uuid"]["string"] == next(d.uuid for d in pool.devices() if d.index == 0)


def test_unhealthy_gpu_leaves_the_slice_with_a_new_generation(node):
    api, pool, plugin, kubelet, base = node
    uuid1 = next(d.uuid for d in pool.devices() if d.index == 1)
    pool.set_device_health({d.uuid: d.uuid != uuid1 for d in pool.devices()})
    assert plugin.publish_slice() is True
    verb, body = api.slice_writes[-1]
    assert verb == "PUT"
    assert body["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in body["spec"]["devices"]] == ["gpu-0"]
    assert plugin.publish_slice() is False  # nothing changed since


@pytest.mark.parametrize("version", ["1.34", "1.35", "1.36", "1.37"])
def test_published_slices_validate_strictly(node, version):
    kv = pytest.importorskip("kubernetes_validate")
    api, pool, plugin, kubelet, base = node
    pool.set_device_health({d.uuid: d.index == 0 for d in pool.devices()})
    plugin.publish_slice()
    assert len(api.slice_writes) == 2
    for _, body in api.slice_writes:
        kv.validate(body, version, strict=True)


def test_renewal_keeps_the_lease_and_takes_a_lost_one_again(node):
    api, pool, plugin, kubelet, base = node
    api.add_claim(resource_claim(NS, "trainer-gpu", UID, [result("gpu-0", "8Gi")]))
    kubelet.register(plugin.registration_socket)
    assert kubelet.prepare(CLAIM).claims[UID].error == ""
    [lease] = dra_leases(pool)
    plugin.preparer.renew()
    assert [x.id for x in dra_leases(pool)] == [lease.id]
    pool.release(lease.id)  # lost behind the plugin's back (an admin, or an expiry while it was down)
    plugin.preparer.renew()
    [again] = dra_leases(pool)
    assert again.id != lease.id and plugin.prepared.get(UID).lease_id == again.id
    assert kubelet.unprepare(CLAIM).claims[UID].error == ""
    assert dra_leases(pool) == []


@pytest.mark.parametrize("memory_mib", [81079, 16384, 97])
def test_the_default_share_is_whole_steps_from_the_minimum(memory_mib):
    # The API server refuses a policy whose default is not min + k * step: an H100 shares 81,079 MiB.
    from gpupool.core.model import Device
    from gpupool.core.quantity import parse_memory_mib
    from gpupool.kube.dra.slices import device_entry

    policy = device_entry(Device("GPU-x", 0, "test", memory_mib))["capacity"]["memory"]["requestPolicy"]
    default = parse_memory_mib(policy["default"])
    low = parse_memory_mib(policy["validRange"]["min"])
    step = parse_memory_mib(policy["validRange"]["step"])
    assert (default - low) % step == 0
    assert 0 <= memory_mib - default < step


def test_an_unreachable_api_server_is_one_error_naming_it():
    from gpupool.kube.apiclient import ApiError

    with pytest.raises(ApiError, match="the API server at http://127.0.0.1:9 is not reachable") as err:
        KubeApi.at("http://127.0.0.1:9").request("GET", "/apis/resource.k8s.io/v1/resourceslices")
    assert err.value.status == 0
