"""deploy/ against the real API server: after deploy/certs.sh, `kubectl apply -k --server-side`
(as a dry run: the API server decodes, defaults, validates and admits every object without
keeping it, so the running test cluster stays as it is) accepts every object, with the optional DRA and MPS parts too;
and each component's service account may do what it needs and is refused what it must not, as
the API server's RBAC decides (`kubectl auth can-i --as`), and as its own token finds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
import yaml

from .cluster_fixture import ROOT

pytestmark = pytest.mark.cluster

DEPLOY = ROOT / "deploy"
SA = "system:serviceaccount:gpupool-system:"
WEBHOOK, AGENT = SA + "gpupool-webhook", SA + "gpupool-agent"


def deploy_copy(tmp_path: Path, components: List[str]) -> Path:
    """deploy/ copied (certs.sh writes into it), certificates made, `components` listed."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("tls"))
    done = subprocess.run(
        ["sh", str(copy / "certs.sh")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    kustomization = copy / "kustomization.yaml"
    data = yaml.safe_load(kustomization.read_text())
    assert data["components"] == ["tls"]  # certs.sh added it
    data["components"] += components
    kustomization.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


@pytest.mark.parametrize("components", [[], ["dra", "mps"]], ids=["base", "dra+mps"])
def test_every_object_of_deploy_is_accepted_by_the_api_server(cluster, tmp_path, components):
    copy = deploy_copy(tmp_path, components)
    rendered = cluster.kubectl("kustomize", str(copy))
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    # Server-side apply: the running cluster registered the webhooks by URL with `kubectl apply
    # --server-side` too, and deploy/'s Service reference replaces that URL as an upgrade would.
    applied = cluster.kubectl("apply", "-k", str(copy), "--server-side", "--force-conflicts", "--dry-run=server")
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.strip().splitlines()
    assert len(lines) == len(objects), applied.stdout
    assert all(line.endswith("serverside-applied (server dry run)") for line in lines), applied.stdout
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "Deployment", "MutatingWebhookConfiguration", "ClusterRoleBinding", "Secret"} <= kinds
    if "dra" in components:
        assert "DeviceClass" in kinds


CAN: List[Tuple[str, str, str, str]] = [
    (WEBHOOK, "list", "nodes", ""),
    (WEBHOOK, "watch", "nodes", ""),
    (WEBHOOK, "list", "pods", ""),
    (WEBHOOK, "get", "pods", ""),
    (WEBHOOK, "patch", "pods", ""),  # the bind's record of its choice
    (WEBHOOK, "create", "pods", "binding"),
    (AGENT, "list", "pods", ""),
    (AGENT, "watch", "pods", ""),
    (AGENT, "create", "resourceslices.resource.k8s.io", ""),
    (AGENT, "delete", "resourceslices.resource.k8s.io", ""),
    (AGENT, "get", "resourceclaims.resource.k8s.io", ""),
    (AGENT, "get", "nodes", ""),
]
CANNOT: List[Tuple[str, str, str, str]] = [
    (WEBHOOK, "create", "pods", ""),
    (WEBHOOK, "delete", "pods", ""),
    (WEBHOOK, "update", "pods", ""),
    (WEBHOOK, "patch", "nodes", ""),
    (WEBHOOK, "get", "secrets", ""),
    (WEBHOOK, "list", "secrets", ""),
    (WEBHOOK, "create", "pods", "eviction"),
    (WEBHOOK, "create", "serviceaccounts", "token"),
    (WEBHOOK, "patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io", ""),
    (AGENT, "patch", "pods", ""),
    (AGENT, "delete", "pods", ""),
    (AGENT, "create", "pods", "binding"),
    (AGENT, "get", "secrets", ""),
    (AGENT, "list", "nodes", ""),
    (AGENT, "patch", "nodes", ""),
    (AGENT, "update", "resourceclaims.resource.k8s.io", ""),
    (AGENT, "update", "resourceclaims.resource.k8s.io", "status"),
]


def can_i(cluster, who: str, verb: str, resource: str, sub: str) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={who}", "--all-namespaces"]
    args += [f"--subresource={sub}"] if sub else []
    done = cluster.kubectl(*args)
    assert done.stdout.strip() in ("yes", "no"), done.stderr
    return done.stdout.strip() == "yes"


def case_id(case: Tuple[str, str, str, str]) -> str:
    who, verb, resource, sub = case
    return "-".join(x for x in (who.rsplit(":", 1)[1], verb, resource, sub) if x)


@pytest.mark.parametrize("case", CAN, ids=case_id)
def test_each_service_account_may_do_what_it_needs(cluster, case):
    assert can_i(cluster, *case)


@pytest.mark.parametrize("case", CANNOT, ids=case_id)
def test_each_service_account_is_refused_what_it_must_not_do(cluster, case):
    assert not can_i(cluster, *case)


@pytest.mark.parametrize("account", ["gpupool-webhook", "gpupool-agent"])
def test_the_running_components_tokens_are_their_service_accounts(cluster, account):
    # The kubeconfig each process runs with: the API server names its service account, and
    # refuses it what RBAC does not grant.
    kubeconfig = str(cluster.side.kubeconfig(account))
    who = subprocess.run(
        [
            str(cluster.cp.kubectl),
            "--kubeconfig",
            kubeconfig,
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert who.stdout == SA + account, who.stderr
    secrets = subprocess.run(
        [str(cluster.cp.kubectl), "--kubeconfig", kubeconfig, "get", "secrets", "-n", "gpupool-system"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert secrets.returncode != 0 and "Forbidden" in secrets.stderr
