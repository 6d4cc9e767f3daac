"""Rendezvous env per framework: what each replica needs to find the others."""

from __future__ import annotations

from typing import Dict, Tuple

from ..plan import Endpoints, Replica
from ..spec import Framework, JobSpec
from .horovod import horovod_env, hostfile
from .tensorflow import cluster_spec, tensorflow_env, tf_config
from .torch import torch_env


def rendezvous_env(spec: JobSpec, reps: Tuple[Replica, ...], endpoints: Endpoints, replica: Replica) -> Dict[str, str]:
    """The framework's rendezvous variables for `replica` (empty for framework none)."""
    if spec.framework is Framework.TENSORFLOW:
        return tensorflow_env(reps, endpoints, replica)
    if spec.framework is Framework.PYTORCH:
        return torch_env(reps, endpoints, replica)
    if spec.framework is Framework.HOROVOD:
        return horovod_env(reps, endpoints, replica)
    return {}


__all__ = [
    "rendezvous_env",
    "tf_config",
    "cluster_spec",
    "tensorflow_env",
    "torch_env",
    "horovod_env",
    "hostfile",
]
