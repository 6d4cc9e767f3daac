"""The deploy/ manifests as data: load them (tests, dry runs) and write the caBundle patch."""

from __future__ import annotations

import base64
import pathlib
import secrets
from typing import Any, Dict, List

import yaml

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
