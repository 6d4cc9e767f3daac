"""The deploy/ manifests as data: load them (tests, dry runs) and write the caBundle patch."""

from __future__ import annotations

import base64
import pathlib
import secrets
from typing import Any, Dict, List

import yaml

from ..core.errors import InvalidInput

WEBHOOK_CONFIGS = (
    ("MutatingWebhookConfiguration", "gpupool-mutate"),
    ("ValidatingWebhookConfiguration", "gpupool-validate"),
)


def load_manifests(directory: str) -> List[Dict[str, Any]]:
    """Every object of every YAML file under `directory` (skipping kustomization files)."""
    out: List[Dict[str, Any]] = []
    for path in sorted(pathlib.Path(directory).rglob("*.yaml")):
        if path.name in ("kustomization.yaml",) or "tls" in path.parts:
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind"):
                out.append(doc)
    return out


def ca_patch(ca_pem: bytes) -> List[Dict[str, Any]]:
    """Kustomize patches that put `ca_pem` into both webhook configurations' caBundle."""
    bundle = base64.b64encode(ca_pem).decode()
    return [
        {
            "target": {"group": "admissionregistration.k8s.io", "version": "v1", "kind": kind, "name": name},
            "patch": yaml.safe_dump([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]),
        }
        for kind, name in WEBHOOK_CONFIGS
    ]


def write_ca_patch(out_dir: str, ca_pem: bytes) -> pathlib.Path:
    """Write `kustomization.yaml` beside the certs: a component with the TLS and agent-token Secrets and caBundle."""
    out = pathlib.Path(out_dir)
    token = out / "agent-token"
    if not token.exists():  # the admin token the agents share and the extender reads them with
        token.write_text(secrets.token_urlsafe(32) + "\n", encoding="utf-8")
        token.chmod(0o600)
    component = {
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "secretGenerator": [
            {
                "name": "gpupool-webhook-tls",
                "type": "kubernetes.io/tls",
                # agent-ca.crt: the webhook and extender verify the node agents with it
                "files": ["tls.crt", "tls.key", "ca.crt", "agent-ca.crt"],
                "options": {"disableNameSuffixHash": True},
            },
            {
                # only the agents mount it: each issues itself a certificate for its node's IP
                "name": "gpupool-agent-ca",
                "type": "kubernetes.io/tls",
                "files": ["tls.crt=agent-ca.crt", "tls.key=agent-ca.key"],
                "options": {"disableNameSuffixHash": True},
            },
            {
                "name": "gpupool-agent-token",
                "files": ["token=agent-token"],
                "options": {"disableNameSuffixHash": True},
            },
        ],
        "patches": ca_patch(ca_pem),
    }
    path = out / "kustomization.yaml"
    path.write_text(yaml.safe_dump(component, sort_keys=False), encoding="utf-8")
    return path


SCHEDULER_DIR = "/etc/kubernetes/gpupool"  # where the control plane keeps the config and the webhook CA


# kube-scheduler adds an extender's score times its weight to its plugins' (0-100 each, and
# several of them spread pods): 5 lets the fragaware ranking decide among nodes that fit.
DEFAULT_EXTENDER_WEIGHT = 5
MAX_EXTENDER_WEIGHT = 100


def check_extender_weight(weight: object) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_EXTENDER_WEIGHT:
        raise InvalidInput(
            f"--weight {weight!r} must be a whole number from 1 to {MAX_EXTENDER_WEIGHT}, e.g. --weight 5"
        )
    return weight


def scheduler_config(
    cluster_ip: str,
    service: str = "gpupool-webhook",
    namespace: str = "gpupool-system",
    port: int = 443,
    kubeconfig: str = "/etc/kubernetes/scheduler.conf",
    ca_file: str = f"{SCHEDULER_DIR}/ca.crt",
    bind: bool = True,
    weight: int = DEFAULT_EXTENDER_WEIGHT,
) -> Dict[str, Any]:
    """The KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) with gpupool's extender,
    whose scores count `weight` times against the default plugins' (which spread pods).

    A kube-scheduler on the host network (kubeadm's static pod) resolves names with the node's
    resolver, where Service DNS names do not exist; so the extender is reached at the Service's
    ClusterIP (kube-proxy routes it on every node), and TLS still checks the Service's DNS name
    (`tlsConfig.serverName`), which the webhook's certificate holds.
    """
    import ipaddress

    from ..core.errors import InvalidInput

    try:
        address = ipaddress.ip_address(cluster_ip)
    except ValueError:
        raise InvalidInput(
            f"--cluster-ip {cluster_ip!r} is not an IP address: use the Service's, from "
            f"kubectl -n {namespace} get service {service} -o jsonpath='{{.spec.clusterIP}}'"
        ) from None
    host = f"[{address}]" if address.version == 6 else str(address)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidInput(f"--port {port!r} must be a TCP port from 1 to 65535, e.g. --port 443")
    extender: Dict[str, Any] = {
        "urlPrefix": f"https://{host}:{port}/extender",
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": check_extender_weight(weight),
        "enableHTTPS": True,
        "tlsConfig": {"serverName": f"{service}.{namespace}.svc", "caFile": ca_file},
        "httpTimeout": "5s",
        # The extender only knows names: it reads GPU state from the node agents.
        "nodeCacheCapable": True,
        # Only pods that ask for gpupool.io/gpu are sent to the extender.
        "managedResources": [{"name": "gpupool.io/gpu", "ignoredByScheduler": False}],
        # If the extender is down, pods still schedule on units alone (the scheduler logs
        # each failed call); the runner then queues at start if a GPU is fragmented.
        "ignorable": True,
    }
    if bind:
        # The extender binds (kube.binder): it records the pod's GPUs (gpupool.io/choice) first. A
        # binder is never ignorable: while the webhook is down, GPU pods wait instead of binding.
        extender.update(bindVerb="bind", ignorable=False)
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "extenders": [extender],
    }
