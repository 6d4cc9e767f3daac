"""The one door to the Kubernetes API server (in cluster only; kept thin, untested here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import InvalidInput

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api


def core_v1(purpose: str, outside_hint: str) -> CoreV1Api:  # pragma: no cover - needs an API server
    """A CoreV1Api from the pod's service account, or a clear error outside a cluster.

    Args:
        purpose: what the API is needed for, for the message.
        outside_hint: the flag to use instead when running outside a cluster.
    """
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException as err:
        raise InvalidInput(
            f"{purpose} through the Kubernetes API, not reachable here ({str(err).rstrip('.')}); "
            f"outside a cluster {outside_hint}"
        ) from None
    return client.CoreV1Api()
