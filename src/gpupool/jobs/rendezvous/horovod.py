"""Horovod's gloo launch env, as `horovodrun --gloo` sets it, and a host/slots file.

Each replica is its own host with one slot (it has its own GPUs), so local
rank is 0, local size 1, cross rank = rank. The rendezvous address is the
HTTP key-value store that `horovodrun` would run; gpupool's local supervisor
runs `kvstore.KVStoreServer` in its place, on loopback, with the job's token.
"""

from __future__ import annotations

from typing import Dict, Tuple

from ..plan import Endpoints, Replica
from .kvstore import TOKEN_ENV


def horovod_env(reps: Tuple[Replica, ...], endpoints: Endpoints, replica: Replica) -> Dict[str, str]:
    """HOROVOD_* variables of `replica`; needs `endpoints.rendezvous` (the KV store)."""
    if endpoints.rendezvous is None:
        raise ValueError("Horovod needs a rendezvous (KV store) address in the endpoints")
    host, port = endpoints.rendezvous
    size, rank = str(len(reps)), str(replica.rank)
    token = endpoints.rendezvous_token
    return {
        # Horovod joins ADDR:PORT/scope/key and can send no header: the token rides as the
        # first path segment ("token:port", see kvstore), so the store refuses anyone without it.
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": f"{host}:{port}/{token}" if token else host,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_HOSTNAME": replica.name,
        "HOROVOD_RANK": rank,
        "HOROVOD_SIZE": size,
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": rank,
        "HOROVOD_CROSS_SIZE": size,
        **({TOKEN_ENV: token} if token else {}),
    }


def hostfile(reps: Tuple[Replica, ...], endpoints: Endpoints) -> str:
    """`host slots=1` per replica, in rank order: the format of mpirun and horovodrun --hostfile."""
    return "".join(f"{endpoints.hosts[r.name]} slots=1\n" for r in sorted(reps, key=lambda r: r.rank))
