"""Kueue's controller as a local process against the test bed's control plane.

Kueue's CRDs and webhook definitions come from its Go module (the version pinned in
tools/kube-cluster/kueue/go.mod, read from the Go module cache, nothing copied here); its
Configuration is Kueue's defaults for a local process (no leader election, no internal
certificate management: its webhook serves a certificate of the cluster's CA on loopback) merged
with deploy/examples/kueue/kueue-configuration.yaml, the settings gpupool's guide tells a cluster
to merge. Only the webhooks Kueue serves here are registered (its own kinds and batch/v1 Jobs), by
URL; they are removed again on stop, so that a stopped Kueue does not refuse every Job (its
webhooks fail closed).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from gpupool.serving.server.ca import issue_server_cert, load_ca, write_cert, write_key

from .controlplane import (
    CERT_DAYS,
    LOOPBACK,
    ROOT,
    START_TIMEOUT_S,
    Component,
    ControlPlane,
    free_port,
    wait_for,
)

MODULE_DIR = ROOT / "tools" / "kube-cluster" / "kueue"
MODULE = "sigs.k8s.io/kueue"
NAMESPACE = "kueue-system"
FRAMEWORKS = ["batch/job"]
# The webhook paths Kueue serves with FRAMEWORKS: its own kinds, and batch/v1 Jobs.
SERVED_PATHS = ("-kueue-x-k8s-io-", "-batch-v1-job")
# Where Kueue's main reads its metrics server's certificate when it manages none itself (a fixed
# path): Kueue runs in a mount namespace of its own with the state folder's pair bound there.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
GPUPOOL_SETTINGS = ROOT / "deploy" / "examples" / "kueue" / "kueue-configuration.yaml"
WEBHOOK_CONFIGS = {
    "MutatingWebhookConfiguration": "gpupool-testbed-kueue-mutating",
    "ValidatingWebhookConfiguration": "gpupool-testbed-kueue-validating",
}


def source_dir() -> Path:
    """Kueue's module in the Go module cache (downloaded by `go` where it is missing)."""
    done = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", MODULE],
        cwd=MODULE_DIR,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"},
    )
    return Path(done.stdout.strip())


def configuration(webhook_port: int, health_port: int, cert_dir: Path) -> Dict[str, Any]:
    """Kueue's Configuration for a local process, with gpupool's settings merged in."""
    config: Dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"{LOOPBACK}:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": LOOPBACK, "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": FRAMEWORKS},
    }
    gpupool = yaml.safe_load(GPUPOOL_SETTINGS.read_text())
    for key, value in gpupool.items():
        if key not in ("apiVersion", "kind"):
            config[key] = value
    return config


def webhook_configurations(source: Path, url: str, ca_bundle: bytes) -> List[Dict[str, Any]]:
    """Kueue's webhook configurations with only the served webhooks, each called at `url` + its path."""
    out = []
    for doc in yaml.safe_load_all((source / "config" / "components" / "webhook" / "manifests.yaml").read_text()):
        if not doc:
            continue
        webhooks = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if any(part in path for part in SERVED_PATHS):
                hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": base64.b64encode(ca_bundle).decode()}
                webhooks.append(hook)
        doc["metadata"] = {"name": WEBHOOK_CONFIGS[doc["kind"]]}
        doc["webhooks"] = webhooks
        out.append(doc)
    return out


@dataclass
class Kueue:
    """Kueue's controller on `plane`, from the `kueue` binary in `bin_dir`."""

    plane: ControlPlane
    bin_dir: Path
    component: Optional[Component] = None
    state: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state = self.plane.state_dir / "kueue"

    def kubectl(self, *args: str, stdin: Optional[str] = None) -> str:
        done = subprocess.run(
            [str(self.plane.kubectl), f"--kubeconfig={self.plane.admin_kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])}: {done.stderr.strip()}")
        return done.stdout

    def start(self) -> Kueue:
        """CRDs, namespace, certificate, configuration, the process, its webhooks; returns once
        Kueue answers /readyz and its webhooks admit a ResourceFlavor (server-side dry run)."""
        source = source_dir()
        self.state.mkdir(parents=True, exist_ok=True)
        certs = self.state / "certs"
        certs.mkdir(exist_ok=True)
        self.kubectl("apply", "--server-side", "-f", str(source / "config" / "components" / "crd" / "bases"))
        crds = str(source / "config" / "components" / "crd" / "bases")
        self.kubectl("wait", "--for=condition=Established", f"--timeout={START_TIMEOUT_S:.0f}s", "-f", crds)
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        )
        ca, ca_key = load_ca(self.plane.ca_cert, self.plane.ca_key)
        cert, key = issue_server_cert(ca, ca_key, "kueue-webhook", ["localhost", LOOPBACK], CERT_DAYS)
        write_key(certs / "tls.key", key)
        write_cert(certs / "tls.crt", cert)
        webhook_port, health_port = free_port(), free_port()
        config_file = self.state / "configuration.yaml"
        config_file.write_text(json.dumps(configuration(webhook_port, health_port, certs), indent=2))
        metrics = self.state / "metrics-certs"
        metrics.mkdir(exist_ok=True)
        cert, key = issue_server_cert(ca, ca_key, "kueue-metrics", ["localhost", LOOPBACK], CERT_DAYS)
        write_key(metrics / "tls.key", key)
        write_cert(metrics / "tls.crt", cert)
        METRICS_CERT_DIR.mkdir(parents=True, exist_ok=True)  # an empty mount point, nothing in it
        bind = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        wrapper = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            bind,
            "sh",
            str(metrics),
            str(METRICS_CERT_DIR),
        ]
        kubeconfig = self.plane.kubeconfig_for("kueue-controller", ("system:masters",))
        self.component = self.plane.start_process(
            "kueue",
            self.bin_dir,
            [f"--config={config_file}", "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info"],
            env={"KUBECONFIG": str(kubeconfig)},
            wrapper=wrapper,
        )
        component = self.component
        wait_for(
            lambda: self.plane.alive(component) and self.plane.http_ok(health_port, "/readyz"),
            START_TIMEOUT_S,
            "Kueue /readyz",
        )
        for doc in webhook_configurations(
            source, f"https://{LOOPBACK}:{webhook_port}", self.plane.ca_cert.read_bytes()
        ):
            self.kubectl("apply", "-f", "-", stdin=json.dumps(doc))
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "probe"}}
        wait_for(
            lambda: self._dry_run(probe),
            START_TIMEOUT_S,
            "Kueue's webhooks admitting a ResourceFlavor",
        )
        return self

    def _dry_run(self, obj: Dict[str, Any]) -> bool:
        try:
            self.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(obj))
        except RuntimeError:
            return False
        return True

    def stop(self) -> None:
        """Its webhooks first (they fail closed), then the process."""
        for kind, name in WEBHOOK_CONFIGS.items():
            try:
                self.kubectl("delete", kind.lower(), name, "--ignore-not-found")
            except (RuntimeError, OSError, subprocess.SubprocessError):
                pass  # the API server may be gone already: nothing then calls the webhooks
        if self.component is not None:
            self.plane.end(self.component)
            self.component = None
