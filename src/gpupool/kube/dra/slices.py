"""The node's ResourceSlice (resource.k8s.io/v1): one pool named after the node, one device per GPU
with its attributes and a consumable `memory` capacity, so a claim can ask for a share of a GPU."""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ...core.model import Device
from ..apiclient import ApiError, KubeApi
from .allocation import MEMORY

log = logging.getLogger(__name__)

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
# The smallest share a claim gets, and the step shares grow by (the scheduler rounds up to it).
SHARE_STEP = "256Mi"
SHARE_STEP_MIB = 256


def device_name(device: Device) -> str:
    """The device's name in the slice and in allocations: 'gpu-INDEX' (a DNS label, stable per node)."""
    return f"gpu-{device.index}"


def slice_name(node: str, driver: str) -> str:
    """The node's one slice of `driver`: 'NODE-DRIVER' (a DNS subdomain, like both parts)."""
    return f"{node}-{driver}"


def device_entry(device: Device, extra: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """One GPU of the slice: attributes, and its memory as consumable capacity (whole by default)."""
    attributes: Dict[str, Dict[str, Any]] = {
        "uuid": {"string": device.uuid},
        "productName": {"string": device.name},
        "index": {"int": device.index},
    }
    for key, value in (extra or {}).items():
        attributes[key] = {"string": value}
    memory = f"{device.memory_mib}Mi"
    step_mib = SHARE_STEP_MIB if device.memory_mib >= SHARE_STEP_MIB else 1
    step = f"{step_mib}Mi"
    # The API server wants (default - min) to be whole steps: a GPU's MiB rarely are (an H100
    # shares 81,079), so the default is the whole steps of it; the rest is less than a step,
    # so a claim that names no memory still has the GPU to itself.
    default = f"{device.memory_mib // step_mib * step_mib}Mi"
    return {
        "name": device_name(device),
        "attributes": attributes,
        "capacity": {
            MEMORY: {
                "value": memory,
                # A claim that names no memory takes the whole GPU; shares are whole steps of 256 MiB.
                "requestPolicy": {"default": default, "validRange": {"min": step, "step": step}},
            }
        },
        "allowMultipleAllocations": True,
    }


def resource_slice(
    driver: str,
    node: str,
    devices: Sequence[Device],
    generation: int,
    extra: Optional[Mapping[str, Mapping[str, str]]] = None,
) -> Dict[str, Any]:
    """The node's ResourceSlice; unhealthy GPUs are left out (the scheduler must not place on them)."""
    entries = [device_entry(d, (extra or {}).get(d.uuid)) for d in sorted(devices, key=lambda d: d.index) if d.healthy]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": entries,
        },
    }


class SlicePublisher:
    """Keeps the node's slice in the API server: created or replaced when the devices change,
    with the pool generation bumped so the scheduler drops what it knew of the older one."""

    def __init__(self, api: KubeApi, driver: str, node: str, extra: Optional[Mapping[str, Mapping[str, str]]] = None):
        self.api, self.driver, self.node, self.extra = api, driver, node, dict(extra or {})
        self.generation = 0
        self._published: Optional[List[Dict[str, Any]]] = None
        self._lock = threading.Lock()

    def publish(self, devices: Sequence[Device]) -> bool:
        """Write the slice if its devices differ from what was last written; True when it wrote."""
        with self._lock:
            generation = self.generation + 1
            body = resource_slice(self.driver, self.node, devices, generation, self.extra)
            if body["spec"]["devices"] == self._published:
                return False
            path = f"{SLICES_PATH}/{slice_name(self.node, self.driver)}"
            try:
                current = self.api.request("GET", path)
            except ApiError as err:
                if err.status != 404:
                    raise
                current = None
            if current is None:
                self.api.request("POST", SLICES_PATH, body)
            else:
                # Above the stored generation too: a restarted agent starts counting from 1 again.
                stored = int(((current.get("spec") or {}).get("pool") or {}).get("generation") or 0)
                generation = max(generation, stored + 1)
                body["spec"]["pool"]["generation"] = generation
                body["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get("resourceVersion", "")
                self.api.request("PUT", path, body)
            self.generation = generation
            self._published = body["spec"]["devices"]
            log.info("published ResourceSlice %s (generation %d, %d device(s))", path, generation, len(self._published))
            return True
