"""Executors: where a job spec runs, each owning its I/O. One small ABC (base.Executor), one per target.

Owns: `TARGETS` (the one list of --target choices) and `get_executor`; `local/` (a package: the
executor, supervisor, state, processes, ports, dashboard reader), `kubernetes` (with the pure
`kube_status`). An executor imports the pure part of jobs and `base`, never another executor.
"""

from __future__ import annotations

from typing import Any

from ...core.errors import InvalidInput
from .base import DryRunInfo, Executor, JobDescription, ReplicaDescription

TARGETS = ("local", "kubernetes", "kubeflow")


def get_executor(target: str, **options: Any) -> Executor:
    """The executor for `target`; heavy clients (kubernetes) are imported only when chosen."""
    if target == "local":
        from .local import LocalExecutor

        return LocalExecutor(**{k: v for k, v in options.items() if k in ("state_dir", "servers", "ttl_s")})
    if target in ("kubernetes", "kubeflow"):
        from .kubernetes import KubernetesExecutor

        return KubernetesExecutor(
            flavour=target, namespace=options.get("namespace"), kube_version=options.get("kube_version")
        )
    raise InvalidInput(f"target {target!r} is unknown: use one of {', '.join(TARGETS)}")


__all__ = ["DryRunInfo", "Executor", "JobDescription", "ReplicaDescription", "TARGETS", "get_executor"]
