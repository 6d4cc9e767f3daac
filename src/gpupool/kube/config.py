"""The one loader of the Kubernetes API's configuration: the kubernetes package's public loaders.

The node agent, the webhook and the extender run in a pod (its service account first); the
job executor runs on a user's machine ($KUBECONFIG first). Each names the order, the loading
and its one-line error are here.
"""

from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, List, Sequence

from ..core.errors import InvalidInput

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration


class Source(enum.Enum):
    """Where a configuration comes from (the value says it in the error message)."""

    IN_CLUSTER = "in a pod: the service account"
    KUBECONFIG = "kubeconfig: $KUBECONFIG or ~/.kube/config"


IN_CLUSTER_ONLY = (Source.IN_CLUSTER,)
IN_CLUSTER_FIRST = (Source.IN_CLUSTER, Source.KUBECONFIG)
KUBECONFIG_FIRST = (Source.KUBECONFIG, Source.IN_CLUSTER)


def load(purpose: str, fix: str, order: Sequence[Source] = IN_CLUSTER_FIRST) -> Configuration:
    """The first configuration of `order` that loads, else InvalidInput naming each reason and `fix`.

    Args:
        purpose: what the API is needed for, for the message.
        fix: what to do instead, for the message ("pass --agents NODE=URL,...").
    """
    try:
        import yaml
        from kubernetes import client, config
    except ImportError:
        raise InvalidInput(f"{purpose} needs the kube extra: pip install 'gpupool[kube]'") from None
    reasons: List[str] = []
    for source in order:
        cfg = client.Configuration()
        try:
            if source is Source.IN_CLUSTER:
                config.load_incluster_config(client_configuration=cfg)
            else:
                # $KUBECONFIG read now: the kubernetes package reads it once, when first imported.
                config.load_kube_config(
                    config_file=os.environ.get("KUBECONFIG") or None, client_configuration=cfg, persist_config=False
                )
        except (config.ConfigException, OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as err:
            # One line: a YAML error spans several.
            reasons.append(f"{source.value}: {' '.join(str(err).split()).rstrip('.') or type(err).__name__}")
            continue
        return cfg
    raise InvalidInput(f"{purpose} through the Kubernetes API, not reachable here ({'; '.join(reasons)}); {fix}")


def api_client(purpose: str, fix: str, order: Sequence[Source] = IN_CLUSTER_FIRST) -> ApiClient:
    """An ApiClient over `load(purpose, fix, order)`."""
    from kubernetes import client

    return client.ApiClient(load(purpose, fix, order))
