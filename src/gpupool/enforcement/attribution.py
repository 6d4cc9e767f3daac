"""Map each process seen on a GPU to the live lease it belongs to, or to none.

Only what the node itself witnessed counts (`isolation.evidence`, `attest.Attestations`); a claim's
holder pid, host and label are labels for people and are never read here. The rules:

1. Attested runner: the process is a runner that proved its lease on the node's attestation socket
   (pid from SO_PEERCRED, so the kernel's word; start time from /proc, so not a reused pid), or
   a descendant of one in the process table. The runner is a child subreaper, so daemonised
   children stay below it. The nearest attested ancestor wins (a `gpupool run` inside another).
2. Kubernetes pod: the process's own cgroup, below the kubelet's kubepods hierarchy, names the
   pod UID that the node read from an attested runner's cgroup (trusts the kubelet's cgroups), or
   a pod the node's DRA plugin prepared the lease for (the ResourceClaim's status.reservedFor,
   from the API server).
3. Lease id in the environment (GPUPOOL_LEASE_ID, which any process can set) only chooses among
   the leases that rules 1 and 2 already tie the process to (a pod holding several leases); it
   never attributes a process alone.

A process no rule ties to a lease is unleased; no claim, token or body can move it into a lease.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set

from ..core.model import Lease
from ..core.usage import ProcessUsage
from ..isolation.evidence import NodeView
from .attest import Attestations


class Attributor:
    """Attributes sampled processes to leases from the node's attestations."""

    def __init__(self, attestations: Optional[Attestations] = None, view: Callable[[], NodeView] = NodeView) -> None:
        self.attestations = attestations if attestations is not None else Attestations()
        self.view = view

    def attribute(self, processes: Iterable[ProcessUsage], leases: Sequence[Lease]) -> List[ProcessUsage]:
        """`processes` with `lease_id` set to their live lease ('' for none)."""
        rows = list(processes)
        live = {lease.id for lease in leases}
        attested = self.attestations.current(live)
        if not rows or not attested:
            return [replace(row, lease_id="") for row in rows]
        view = self.view()
        runners: Dict[int, str] = {}
        pods: Dict[str, Set[str]] = {}
        for lease_id, witnesses in attested.items():
            for witness in witnesses:
                if witness.pid:  # a runner; pid 0: a pod the node assigned the lease to (DRA)
                    if view.started(witness.pid) != witness.start_ticks:
                        continue  # ended, or its pid now names another process
                    runners[witness.pid] = lease_id
                if witness.pod_uid:
                    pods.setdefault(witness.pod_uid, set()).add(lease_id)
        return [replace(row, lease_id=self._lease_of(row.pid, view, runners, pods)) for row in rows]

    @staticmethod
    def _lease_of(pid: int, view: NodeView, runners: Dict[int, str], pods: Dict[str, Set[str]]) -> str:
        for ancestor in view.lineage(pid):  # rule 1
            if ancestor in runners:
                return runners[ancestor]
        if not pods:
            return ""
        uid = view.pod_of(pid)  # rule 2
        candidates = pods.get(uid, set()) if uid else set()
        if len(candidates) == 1:
            return next(iter(candidates))
        hint = view.lease_env_of(pid) if candidates else None  # rule 3: only among rule 2's leases
        return hint if hint in candidates else ""
