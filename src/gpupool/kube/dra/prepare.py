"""NodePrepareResources / NodeUnprepareResources for one claim: a lease in the node's pool for
what the scheduler allocated, a CDI spec that hands the container its GPUs and limits, and a
prepared-claims entry, so both answers are idempotent and survive a restart of the plugin.

Why the lease lives until unprepare: it is taken with a long TTL (LEASE_TTL_S) that the plugin
renews (`renew`) while the claim is prepared, and labelled with the claim (not a pod), so the
agent's reaper of gone pods leaves it alone; only NodeUnprepareResources releases it. A lease
that expired anyway (the agent was down longer than the TTL) is taken again at the next renewal.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ...core.errors import GpupoolError, NotFound
from ...core.filters import Filter
from ...core.isolation_mode import IsolationMode
from ...core.model import Claim, Device, GpuRequest, Holder, Lease
from ...pooling.isolation.env import GpuShare, child_env, isolation_env
from ...pooling.pool import Pool
from ...serving.enforcement.attest import Attestations
from ..apiclient import ApiError, KubeApi
from .allocation import AllocatedDevice, allocated_devices, reserved_pods
from .cdi import CdiDevice, CdiMount, remove_spec, write_spec
from .prepared_claims import PreparedClaim, PreparedDevice, PreparedStore
from .slices import device_name

log = logging.getLogger(__name__)

LEASE_TTL_S = 3600.0
RENEW_EVERY_S = 60.0
HOLDER_NAME = "dra"
LABEL_PREFIX = "dra-claim:"  # not "pod:": the reaper of gone pods must keep these leases
# Where the post-import hook folder (isolation/hook) appears in containers.
HOOK_CONTAINER_DIR = "/run/gpupool/hook"


def claim_label(namespace: str, name: str, uid: str) -> str:
    """The lease label of a claim: 'dra-claim:NS/NAME:UID'."""
    return f"{LABEL_PREFIX}{namespace}/{name}:{uid}"


def claim_uid_of_label(label: str) -> str:
    """The claim UID of a DRA lease label, '' for any other label."""
    return label.rsplit(":", 1)[-1] if label.startswith(LABEL_PREFIX) else ""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


class PrepareError(Exception):
    """A claim this node cannot prepare; its message goes into that claim's response entry."""


class Preparer:
    """Prepares and unprepares claims against the node's pool (one at a time: it is not a hot path).

    Args:
        hook_dir: the host folder holding the post-import hook (None: no hook is mounted).
        evidence: where the node records the pods a claim's lease is for (its watchdog attributes
            their processes to the lease: there is no runner in a DRA container to attest).
    """

    def __init__(
        self,
        pool: Pool,
        api: KubeApi,
        prepared: PreparedStore,
        driver: str,
        node: str,
        cdi_dir: str,
        hook_dir: Optional[str] = None,
        evidence: Optional[Attestations] = None,
    ) -> None:
        self.pool, self.api, self.prepared = pool, api, prepared
        self.evidence = evidence
        self.driver, self.node, self.cdi_dir, self.hook_dir = driver, node, cdi_dir, hook_dir
        self._lock = threading.Lock()

    # -- prepare -----------------------------------------------------------
    def prepare(self, ref: ClaimRef) -> List[PreparedDevice]:
        """The devices of `ref`, prepared now or earlier; PrepareError says why not."""
        with self._lock:
            done = self.prepared.get(ref.uid)
            if done is not None:
                return list(done.devices)
            try:
                return list(self._prepare(ref).devices)
            except (GpupoolError, ApiError) as err:
                raise PrepareError(f"claim {ref}: {err}") from None

    def _prepare(self, ref: ClaimRef) -> PreparedClaim:
        allocated, pods = self._allocated(ref)
        if not allocated:  # only other drivers' devices: nothing to do here, and nothing to remember
            return PreparedClaim(ref.uid, ref.namespace, ref.name, "", ())
        devices = self._devices_of(allocated)
        lease = self._lease(ref, allocated, devices)
        try:
            prepared = self._write_cdi(ref, lease, allocated, devices)
            if self.evidence is not None:
                for pod_uid in pods:
                    self.evidence.add_pod(lease.id, pod_uid)
            self.prepared.put(prepared)
        except BaseException:
            self._release(lease.id)
            remove_spec(self.cdi_dir, self.driver, ref.uid)
            raise
        log.info("prepared claim %s: lease %s on %s", ref, lease.id, ", ".join(sorted({a.device for a in allocated})))
        return prepared

    def _allocated(self, ref: ClaimRef) -> Tuple[List[AllocatedDevice], List[str]]:
        """This driver's devices in the claim's allocation, and the UIDs of the pods it is reserved for."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{ref.namespace}/resourceclaims/{ref.name}"
        try:
            claim = self.api.request("GET", path)
        except ApiError as err:
            if err.status == 404:
                raise PrepareError(f"claim {ref}: ResourceClaim not found") from None
            raise
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(f"claim {ref}: the ResourceClaim of that name now has UID {uid} (recreated)")
        allocated = allocated_devices(claim, self.driver)
        for a in allocated:
            if a.pool != self.node:
                raise PrepareError(
                    f"claim {ref}: device {a.device} is in pool {a.pool!r}, not this node's {self.node!r}"
                )
        return allocated, reserved_pods(claim)

    def _devices_of(self, allocated: Sequence[AllocatedDevice]) -> Dict[str, Device]:
        by_name = {device_name(d): d for d in self.pool.devices()}
        unknown = sorted({a.device for a in allocated if a.device not in by_name})
        if unknown:
            raise PrepareError(f"unknown device(s) {', '.join(unknown)}: this node has {', '.join(sorted(by_name))}")
        return {a.device: by_name[a.device] for a in allocated}

    def _lease(self, ref: ClaimRef, allocated: Sequence[AllocatedDevice], devices: Dict[str, Device]) -> Lease:
        """This claim's lease: one left by an earlier attempt that died before its entry was stored, else a new one."""
        label = claim_label(ref.namespace, ref.name, ref.uid)
        for lease in self.pool.status().leases:
            if claim_uid_of_label(lease.holder.label) == ref.uid:
                return lease
        holder = Holder(name=HOLDER_NAME, host=self.node, label=label)
        return self.pool.claim(pool_claim(allocated, devices), holder, ttl_s=LEASE_TTL_S)

    def _write_cdi(
        self, ref: ClaimRef, lease: Lease, allocated: Sequence[AllocatedDevice], devices: Dict[str, Device]
    ) -> PreparedClaim:
        """One CDI device per request (all its GPUs: the env of one container names them together),
        its IDs on the request's first device of the response."""
        isolation = self.pool.status().isolation
        requests: Dict[str, List[AllocatedDevice]] = {}
        for a in allocated:
            requests.setdefault(a.request, []).append(a)
        cdi_devices = []
        for n, (request, results) in enumerate(requests.items()):
            shares = per_gpu_shares(results, devices)
            contract = isolation_env(
                lease.id,
                shares,
                HOOK_CONTAINER_DIR if self.hook_dir else None,
                isolation=isolation,
            )
            mounts: List[CdiMount] = []
            if self.hook_dir and isolation.mode is not IsolationMode.NONE:
                mounts.append(CdiMount(self.hook_dir, HOOK_CONTAINER_DIR))
            if isolation.mode is IsolationMode.MPS and isolation.mps_pipe_dir:
                mounts.append(CdiMount(isolation.mps_pipe_dir, isolation.mps_pipe_dir, read_only=False))
            env = child_env({}, contract)  # the contract, and the hook folder on PYTHONPATH
            cdi_devices.append((request, CdiDevice(f"{ref.uid}-{n}", env, tuple(mounts))))
        ids = write_spec(self.cdi_dir, self.driver, ref.uid, [d for _, d in cdi_devices])
        by_request = {request: cdi_id for (request, _), cdi_id in zip(cdi_devices, ids)}
        answer = []
        for a in allocated:
            first = requests[a.request][0] is a
            cdi_ids = (by_request[a.request],) if first else ()
            answer.append(PreparedDevice((a.request,), a.pool, a.device, cdi_ids))
        return PreparedClaim(ref.uid, ref.namespace, ref.name, lease.id, tuple(answer))

    # -- unprepare ---------------------------------------------------------
    def unprepare(self, ref: ClaimRef) -> None:
        """Release the claim's lease and remove its spec; a claim not prepared here is fine."""
        with self._lock:
            done = self.prepared.get(ref.uid)
            if done is not None:
                self._release(done.lease_id)
            for lease in self.pool.status().leases:  # one taken by an attempt that died before its entry was stored
                if claim_uid_of_label(lease.holder.label) == ref.uid:
                    self._release(lease.id)
            remove_spec(self.cdi_dir, self.driver, ref.uid)
            self.prepared.remove(ref.uid)
            if done is not None:
                log.info("unprepared claim %s: lease %s released", ref, done.lease_id)

    def _release(self, lease_id: str) -> None:
        try:
            self.pool.release(lease_id)
        except NotFound:
            pass  # released or expired already

    # -- keeping leases alive ----------------------------------------------
    def renew(self) -> None:
        """Heartbeat the lease of every prepared claim; take again one that was lost."""
        for prepared in self.prepared.all():
            try:
                self.pool.heartbeat(prepared.lease_id)
                continue
            except NotFound:
                pass
            with self._lock:
                if self.prepared.get(prepared.uid) != prepared:
                    continue  # unprepared (or retaken) meanwhile
                ref = ClaimRef(prepared.namespace, prepared.uid, prepared.name)
                log.warning("lease %s of prepared claim %s is gone: taking it again", prepared.lease_id, ref)
                self.prepared.remove(ref.uid)
                try:
                    self._prepare(ref)
                except (GpupoolError, ApiError, PrepareError) as err:
                    self.prepared.put(prepared)  # still prepared for the kubelet; unprepare will clean up
                    log.error("claim %s runs without a lease: %s", ref, err)


def pool_claim(allocated: Sequence[AllocatedDevice], devices: Dict[str, Device]) -> Claim:
    """The pool claim for an allocation: per device, the MiB consumed (summed over its results),
    pinned to that device by UUID; all granted together or not at all."""
    mib: Dict[str, int] = {}
    for a in allocated:
        device = devices[a.device]
        mib[device.uuid] = mib.get(device.uuid, 0) + (a.memory_mib if a.memory_mib is not None else device.memory_mib)
    if not mib:
        raise PrepareError("no device of this driver in the allocation")
    requests = tuple(
        GpuRequest(1, memory_mib=m, filters=(Filter("device.uuid", "=", uuid),)) for uuid, m in sorted(mib.items())
    )
    return Claim(requests)


def per_gpu_shares(results: Sequence[AllocatedDevice], devices: Dict[str, Device]) -> List[GpuShare]:
    """The GPUs of one request in allocation order, each with the MiB it consumes."""
    shares: List[Tuple[str, int, int]] = []
    for a in results:
        d = devices[a.device]
        shares.append((d.uuid, a.memory_mib if a.memory_mib is not None else d.memory_mib, d.memory_mib))
    return [GpuShare(uuid, mib, total) for uuid, mib, total in shares]
