"""Map each process seen on a GPU to the live lease it belongs to, or to none.

In order of trust:
1. on this host, the process is the holder of a lease or one of its descendants
   (the runner is a child subreaper, so daemonised children stay below it);
2. on Kubernetes, the pod UID in the process's cgroup is the pod that holds the
   lease (the runner labels its claim with the pod UID);
3. the process carries the lease id in its environment (GPUPOOL_LEASE_ID), which
   every child of `gpupool run` inherits: this catches descendants whose parent
   chain was cut (reparented to init) and holders on another host.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from ..core.model import Lease
from ..core.usage import ProcessUsage
from ..isolation import proctree

PodOf = Callable[[int], Optional[str]]
LeaseOf = Callable[[int], Optional[str]]


class Attributor:
    """Attributes sampled processes to leases; `host` is this node's host name."""

    def __init__(
        self,
        host: Optional[str] = None,
        pod_of: PodOf = proctree.pod_uid_of,
        lease_of: LeaseOf = proctree.lease_id_of,
    ) -> None:
        self.host = host or socket.gethostname()
        self.pod_of = pod_of
        self.lease_of = lease_of

    def attribute(self, processes: Iterable[ProcessUsage], leases: Sequence[Lease]) -> List[ProcessUsage]:
        """`processes` with `lease_id` set to their live lease ('' for none)."""
        rows = list(processes)
        if not rows:
            return rows
        by_id = {lease.id: lease for lease in leases}
        local = {
            lease.holder.pid: lease.id for lease in leases if lease.holder.host == self.host and lease.holder.pid > 0
        }
        by_pod: Dict[str, str] = {}
        for lease in leases:
            uid = lease.holder.pod_uid
            if uid:
                by_pod.setdefault(uid, lease.id)
        table = proctree.process_table() if local else {}
        result = []
        for row in rows:
            lease_id = self._lease_of(row.pid, local, table, by_pod, by_id)
            result.append(replace(row, lease_id=lease_id))
        return result

    def _lease_of(
        self,
        pid: int,
        local: Dict[int, str],
        table: Dict[int, proctree.ProcessInfo],
        by_pod: Dict[str, str],
        by_id: Dict[str, Lease],
    ) -> str:
        for holder_pid, lease_id in local.items():
            if pid == holder_pid or proctree.is_descendant(pid, holder_pid, table):
                return lease_id
        if by_pod:
            uid = self.pod_of(pid)
            if uid and uid in by_pod:
                return by_pod[uid]
        claimed = self.lease_of(pid)
        return claimed if claimed and claimed in by_id else ""
