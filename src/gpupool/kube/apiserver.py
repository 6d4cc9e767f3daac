"""The one door to the Kubernetes API server (in cluster only; kept thin, untested here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api


def core_v1(purpose: str, outside_hint: str) -> CoreV1Api:  # pragma: no cover - needs an API server
    """A CoreV1Api from the pod's service account, or a clear error outside a cluster.

    Args:
        purpose: what the API is needed for, for the message.
        outside_hint: the flag to use instead when running outside a cluster.
    """
    from kubernetes import client

    from .kubeconfig import IN_CLUSTER_ONLY, api_client

    return client.CoreV1Api(api_client(purpose, f"outside a cluster {outside_hint}", IN_CLUSTER_ONLY))
