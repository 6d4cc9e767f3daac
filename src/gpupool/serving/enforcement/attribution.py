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

A process no rule ties to a lease is unleased; no claim, token or body can move it into a lease,
except the node's own MPS infrastructure (`infrastructure` on its row): a process that is, or
descends from, the MPS control daemon the node supervises or adopted (its pid and start time, from
`mps_daemon`, matched in the process table), such as the MPS server it starts. Never by a
process's name or command line: any local user can name a process nvidia-cuda-mps-server.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ...core.model import Lease
from ...core.usage import ProcessUsage
from ...pooling.isolation.evidence import NodeView
from .attest import Attestations


class Attributor:
    """Attributes sampled processes to leases from the node's attestations."""

    def __init__(
        self,
        attestations: Optional[Attestations] = None,
        view: Callable[[], NodeView] = NodeView,
        mps_daemon: Callable[[], Optional[Tuple[int, int]]] = lambda: None,
    ) -> None:
        self.attestations = attestations if attestations is not None else Attestations()
        self.view = view
        # The running MPS control daemon's (pid, start ticks) when the node supervises one, else None.
        self.mps_daemon = mps_daemon

    def attribute(self, processes: Iterable[ProcessUsage], leases: Sequence[Lease]) -> List[ProcessUsage]:
        """`processes` with `lease_id` set to their live lease ('' for none) and `infrastructure`
        set on the node's own MPS processes (no lease's; the check is here alone)."""
        rows = list(processes)
        live = {lease.id for lease in leases}
        attested = self.attestations.current(live)
        daemon = self.mps_daemon()
        if not rows or (not attested and daemon is None):
            return [replace(row, lease_id="", infrastructure=False) for row in rows]
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
        attributed = []
        for row in rows:
            lease_id = self._lease_of(row.pid, view, runners, pods) if attested else ""
            mps = not lease_id and daemon is not None and view.descends_from(row.pid, *daemon)
            attributed.append(replace(row, lease_id=lease_id, infrastructure=mps))
        return attributed

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
