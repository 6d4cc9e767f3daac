"""Expand a spec into its replicas, in rank order, and the one gang claim for their GPUs.

Every executor uses the same expansion, so replica names, ranks and the
claim group of each replica agree between local runs and Kubernetes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple, Union

from ..core.model import Claim
from .spec import SERVICE_ROLES, Framework, JobSpec, RoleSpec


@dataclass(frozen=True)
class Replica:
    """One process of the job."""

    role: str
    index: int  # index within its role (TF_CONFIG task.index, Indexed Job completion index)
    rank: int  # position over all replicas in rank order (PyTorch RANK for trainer roles)
    group: Optional[int]  # index of its GpuRequest in the gang claim; None: no GPU

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def is_service(self) -> bool:
        """ps and evaluator serve the trainers and never finish on their own."""
        return self.role in SERVICE_ROLES


def replicas(spec: JobSpec) -> Tuple[Replica, ...]:
    """All replicas of `spec` in rank order (the spec keeps roles in framework order)."""
    out: List[Replica] = []
    group = 0
    for role in spec.roles:
        for i in range(role.replicas):
            g: Optional[int] = None
            if role.gpu is not None:
                g, group = group, group + 1
            out.append(Replica(role.name, i, len(out), g))
    return tuple(out)


def gang_claim(spec: JobSpec) -> Optional[Claim]:
    """One claim with a request per GPU-holding replica, or None when no replica wants a GPU."""
    requests = [role.gpu for role in spec.roles for _ in range(role.replicas) if role.gpu is not None]
    return Claim(tuple(requests), spec.placement, queue=spec.queue, priority=spec.priority) if requests else None


def role_of(spec: JobSpec, replica: Replica) -> RoleSpec:
    role = spec.role(replica.role)
    assert role is not None, replica
    return role


def chief(spec: JobSpec, reps: Tuple[Replica, ...]) -> Replica:
    """The replica whose success is the job's success: chief, else master, else worker 0."""
    for name in ("chief", "master", "worker"):
        found = [r for r in reps if r.role == name]
        if found:
            return found[0]
    return reps[0]


def trainers(reps: Tuple[Replica, ...]) -> Tuple[Replica, ...]:
    """Replicas that train and finish: everything except ps and evaluator."""
    return tuple(r for r in reps if not r.is_service)


def group_restart(spec: JobSpec) -> bool:
    """Whether one failed replica restarts the whole job.

    Collective training (DDP, Horovod, MultiWorkerMirrored) cannot take a
    single new member mid-run, so the group restarts together as torchrun does;
    ParameterServerStrategy and framework 'none' tolerate one replica restarting.
    """
    if spec.framework is Framework.NONE:
        return False
    return not (spec.framework is Framework.TENSORFLOW and spec.role("ps") is not None)


@dataclass(frozen=True)
class Endpoints:
    """Where each replica listens: host and port per replica name, plus an optional
    rendezvous service (the Horovod gloo KV store) as host and port."""

    hosts: Mapping[str, str]
    ports: Mapping[str, Union[int, str]]  # str only for dry-run placeholders
    rendezvous: Optional[Tuple[str, Union[int, str]]] = None  # str port only for dry-run placeholders
    rendezvous_token: str = ""  # the store's secret (kvstore.KVStoreServer.token); "" = none known

    def address(self, replica: Replica) -> str:
        return f"{self.hosts[replica.name]}:{self.ports[replica.name]}"


def local_endpoints(reps: Tuple[Replica, ...], ports: List[int], host: str = "127.0.0.1") -> Endpoints:
    """Every replica on this host, each on its own port, in order; no rendezvous address
    (the supervisor adds its Horovod KV store's)."""
    names = [r.name for r in reps]
    return Endpoints(dict.fromkeys(names, host), dict(zip(names, ports)))
