"""TF_CONFIG as TensorFlow documents it for tf.distribute.

    {"cluster": {"chief": ["host:port"], "worker": [...], "ps": [...]},
     "task": {"type": "worker", "index": 0}}

Every process gets the same cluster and its own task. The evaluator is kept
out of the cluster (it is not part of training; TensorFlow and the Kubeflow
operator both leave it out) but sees the cluster it evaluates. With no chief,
MultiWorkerMirroredStrategy makes worker 0 the chief by itself.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from ..plan import Endpoints, Replica

TRAINING_ROLES = ("chief", "worker", "ps")  # TensorFlow's order; evaluator is left out


def cluster_spec(reps: Tuple[Replica, ...], endpoints: Endpoints) -> Dict[str, List[str]]:
    """{role: ["host:port", ...]} for the roles that take part in training, by index."""
    cluster: Dict[str, List[str]] = {}
    for role in TRAINING_ROLES:
        members = sorted((r for r in reps if r.role == role), key=lambda r: r.index)
        if members:
            cluster[role] = [endpoints.address(r) for r in members]
    return cluster


def tf_config(reps: Tuple[Replica, ...], endpoints: Endpoints, replica: Replica) -> Dict[str, Any]:
    """The TF_CONFIG object of `replica` (json.dumps it for the env)."""
    return {
        "cluster": cluster_spec(reps, endpoints),
        "task": {"type": replica.role, "index": replica.index},
    }


def tensorflow_env(reps: Tuple[Replica, ...], endpoints: Endpoints, replica: Replica) -> Dict[str, str]:
    """Env of one TensorFlow replica: TF_CONFIG, compact and with stable key order."""
    return {"TF_CONFIG": json.dumps(tf_config(reps, endpoints, replica), separators=(",", ":"))}
