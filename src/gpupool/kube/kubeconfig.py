"""The one loader of the Kubernetes API's configuration: the kubernetes package's public loaders.

The node agent, the webhook and the extender run in a pod (its service account first); the
job executor runs on a user's machine ($KUBECONFIG first). Each names the order, the loading
and its one-line error are here. A component run as a plain process (on a local control plane:
`make cluster-up`) is given a kubeconfig with its service account's token instead
(`--kubeconfig FILE`, `use_kubeconfig`), which then is the only source of that process.
"""

from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, List, Optional, Sequence

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

# A component's --kubeconfig: one identity per process, so one setting per process.
_given: Optional[str] = None


def use_kubeconfig(path: Optional[str]) -> None:
    """Every later `load` of this process reads the kubeconfig `path` alone, whatever order its
    caller names (None: back to the callers' orders). For a component run outside a pod with its
    service account's token (`--kubeconfig FILE`)."""
    global _given
    if path is not None and not os.path.isfile(path):
        raise InvalidInput(f"--kubeconfig {path!r} does not exist: give a kubeconfig file (kubectl config view --raw)")
    _given = path


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
    for source in order if _given is None else (Source.KUBECONFIG,):
        cfg = client.Configuration()
        try:
            if source is Source.IN_CLUSTER:
                config.load_incluster_config(client_configuration=cfg)
            else:
                # $KUBECONFIG read now: the kubernetes package reads it once, when first imported.
                config.load_kube_config(
                    config_file=_given or os.environ.get("KUBECONFIG") or None,
                    client_configuration=cfg,
                    persist_config=False,
                )
        except (config.ConfigException, OSError, ValueError, TypeError, KeyError, yaml.YAMLError) as err:
            # One line: a YAML error spans several.
            where = f"--kubeconfig {_given}" if _given else source.value
            reasons.append(f"{where}: {' '.join(str(err).split()).rstrip('.') or type(err).__name__}")
            continue
        return cfg
    raise InvalidInput(f"{purpose} through the Kubernetes API, not reachable here ({'; '.join(reasons)}); {fix}")


def api_client(purpose: str, fix: str, order: Sequence[Source] = IN_CLUSTER_FIRST) -> ApiClient:
    """An ApiClient over `load(purpose, fix, order)`."""
    from kubernetes import client

    return client.ApiClient(load(purpose, fix, order))
