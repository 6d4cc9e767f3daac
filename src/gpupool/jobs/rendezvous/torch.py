"""The env torchrun gives each worker, and the PET_* variables torchrun itself reads.

Each replica is its own "node" with one process: it has its own
CUDA_VISIBLE_DEVICES, so LOCAL_RANK is 0 everywhere (a script doing
`cuda.set_device(LOCAL_RANK)` lands on its own share) and NODE_RANK is its
rank. A script that wraps itself in torchrun reads PET_NNODES, PET_NODE_RANK,
PET_MASTER_ADDR and PET_MASTER_PORT (as under the Kubeflow PyTorchJob).
"""

from __future__ import annotations

from typing import Dict, Tuple

from ..plan import Endpoints, Replica


def torch_env(reps: Tuple[Replica, ...], endpoints: Endpoints, replica: Replica) -> Dict[str, str]:
    """MASTER_ADDR/PORT, WORLD_SIZE, RANK, LOCAL_RANK ... for `replica` (rank 0 is the master)."""
    world = len(reps)
    master = min(reps, key=lambda r: r.rank)
    addr, port = endpoints.hosts[master.name], str(endpoints.ports[master.name])
    rank = str(replica.rank)
    role_members = [r for r in reps if r.role == replica.role]
    return {
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        "WORLD_SIZE": str(world),
        "RANK": rank,
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": rank,
        "GROUP_WORLD_SIZE": str(world),
        "ROLE_NAME": replica.role,
        "ROLE_RANK": str(replica.index),
        "ROLE_WORLD_SIZE": str(len(role_members)),
        "PET_MASTER_ADDR": addr,
        "PET_MASTER_PORT": port,
        "PET_NNODES": str(world),
        "PET_NODE_RANK": rank,
        "PET_NPROC_PER_NODE": "1",
    }
