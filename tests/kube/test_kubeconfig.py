"""kube.config, the one loader of the Kubernetes API's configuration: a kubeconfig on disk is read
through the kubernetes package's loaders, missing or broken ones give one line naming each source
and the fix, and no other module loads a configuration itself."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpupool.core.errors import InvalidInput

pytest.importorskip("kubernetes")

from gpupool.kube.kubeconfig import (
    IN_CLUSTER_FIRST,
    IN_CLUSTER_ONLY,
    KUBECONFIG_FIRST,
    api_client,
    load,
    use_kubeconfig,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "gpupool"


def kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig as `kubectl config view --raw` writes it (JSON is YAML)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "tok-123"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


def test_a_kubeconfig_is_loaded_in_either_order_outside_a_pod(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kc", "https://10.1.2.3:6443")))
    for order in (KUBECONFIG_FIRST, IN_CLUSTER_FIRST):
        cfg = load("the test lists pods", "set KUBECONFIG", order)
        assert cfg.host == "https://10.1.2.3:6443"
        assert cfg.api_key == {"BearerToken": "Bearer tok-123"}
    assert api_client("the test", "set KUBECONFIG").configuration.host == "https://10.1.2.3:6443"


def test_in_cluster_only_outside_a_pod_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "kc", "https://10.1.2.3:6443")))
    with pytest.raises(InvalidInput) as err:
        load("the agent reaps leases of gone pods", "outside a cluster pass --no-reap", IN_CLUSTER_ONLY)
    message = err.value.message
    assert "\n" not in message
    assert message.startswith("the agent reaps leases of gone pods through the Kubernetes API, not reachable here")
    assert "service account" in message and message.endswith("outside a cluster pass --no-reap")


def test_a_given_kubeconfig_is_the_only_source_whatever_the_order(tmp_path, monkeypatch):
    # A component run as a plain process (a local control plane) with its service account's token.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig(tmp_path / "user", "https://10.9.9.9:6443")))
    given = kubeconfig(tmp_path / "agent", "https://127.0.0.1:6443")
    use_kubeconfig(str(given))
    try:
        for order in (IN_CLUSTER_ONLY, KUBECONFIG_FIRST, IN_CLUSTER_FIRST):
            assert load("the agent reaps leases of gone pods", "pass --no-reap", order).host == "https://127.0.0.1:6443"
        given.write_text("{not: [yaml")
        with pytest.raises(InvalidInput) as err:
            load("the agent reaps leases of gone pods", "pass --no-reap", IN_CLUSTER_ONLY)
        assert f"--kubeconfig {given}:" in err.value.message and "service account" not in err.value.message
    finally:
        use_kubeconfig(None)
    with pytest.raises(InvalidInput):
        use_kubeconfig(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "kubeconfig"),  # no file at all
        ("{not: [yaml", "kubeconfig"),
        ('{"apiVersion": "v1", "kind": "Config", "clusters": []}', "kubeconfig"),
    ],
)
def test_missing_or_broken_kubeconfig_names_both_sources_and_the_fix(tmp_path, monkeypatch, content, says):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kc"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("KUBECONFIG", str(path))
    with pytest.raises(InvalidInput) as err:
        load("--target kubernetes runs the job", "set KUBECONFIG", KUBECONFIG_FIRST)
    message = err.value.message
    assert "\n" not in message and "Traceback" not in message
    assert says in message and "service account" in message and message.endswith("set KUBECONFIG")


def test_no_module_but_kube_config_loads_a_kubernetes_configuration():
    loaders = re.compile(r"\bload_(incluster|kube)_config\b|new_client_from_config")
    users = sorted(
        str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if "_pb2" not in p.name and loaders.search(p.read_text())
    )
    assert users == ["kube/kubeconfig.py"]
