"""deploy/: every object loads into the kubernetes client's models; the wiring is consistent."""

from __future__ import annotations

import pathlib

import pytest
import yaml

from gpupool.cli.main import main
from gpupool.kube.manifests import load_manifests

DEPLOY = pathlib.Path(__file__).resolve().parents[2] / "deploy"
MODELS = {
    "Namespace": "V1Namespace",
    "ServiceAccount": "V1ServiceAccount",
    "ClusterRole": "V1ClusterRole",
    "ClusterRoleBinding": "V1ClusterRoleBinding",
    "Secret": "V1Secret",
    "DaemonSet": "V1DaemonSet",
    "Deployment": "V1Deployment",
    "Service": "V1Service",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
    "MutatingWebhookConfiguration": "V1MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration": "V1ValidatingWebhookConfiguration",
    "ResourceQuota": "V1ResourceQuota",
    "Pod": "V1Pod",
    "DeviceClass": "V1DeviceClass",  # deploy/dra
    "ResourceClaimTemplate": "V1ResourceClaimTemplate",  # deploy/examples/dra
    "Job": "V1Job",
}
# The one role that writes: the DRA plugin publishes its node's ResourceSlices (deploy/dra/rbac.yaml).
# The only roles that write, and what: the DRA agent its slices; the extender's bind (opt-in,
# deploy/scheduler/binder-rbac.yaml) the pod's gpupool.io/choice annotation and its Binding.
WRITERS = {"gpupool-agent-dra": {"resourceslices"}, "gpupool-extender-binder": {"pods", "pods/binding"}}


def load(obj, model):
    from kubernetes.client import ApiClient

    return ApiClient()._ApiClient__deserialize(obj, model)


@pytest.fixture(scope="module")
def objects():
    return load_manifests(str(DEPLOY))


def test_every_object_loads_into_its_model(objects):
    kinds = set()
    for obj in objects:
        if obj["kind"] == "KubeSchedulerConfiguration":
            continue  # a file for the control plane, not an API object
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # the Prometheus operator's kinds (deploy/monitoring): tests/monitoring builds them
        if obj["apiVersion"].startswith(("kueue.x-k8s.io/", "config.kueue.x-k8s.io/")):
            continue  # Kueue's kinds (deploy/examples/kueue): tests/kube/test_kueue_examples.py checks them
        model = MODELS[obj["kind"]]
        loaded = load(obj, model)
        assert loaded.metadata.name == obj["metadata"]["name"]
        kinds.add(obj["kind"])
    assert {"DaemonSet", "Deployment", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} <= kinds


def test_kustomization_lists_existing_files():
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    for name in kust["resources"]:
        assert (DEPLOY / name).is_file(), name


def test_no_cluster_admin_and_read_only_rbac(objects):
    for obj in objects:
        if obj["kind"] == "ClusterRoleBinding":
            assert obj["roleRef"]["name"] != "cluster-admin"
        if obj["kind"] == "ClusterRole":
            for rule in obj["rules"]:
                assert "*" not in rule["resources"]
                if set(rule["verbs"]) <= {"get", "list", "watch"}:
                    continue
                assert set(rule["resources"]) <= WRITERS.get(obj["metadata"]["name"], set()), (obj["metadata"], rule)


def test_webhooks_are_fail_safe_and_scoped(objects):
    configs = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert len(configs) == 2
    for cfg in configs:
        for hook in cfg["webhooks"]:
            assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
            assert hook["timeoutSeconds"] <= 10
            excluded = [
                e for e in hook["namespaceSelector"]["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"
            ][0]
            assert excluded["operator"] == "NotIn"
            assert {"kube-system", "gpupool-system"} <= set(excluded["values"])


def test_deployment_has_two_replicas_and_probes(objects):
    deploy = load(next(o for o in objects if o["kind"] == "Deployment"), "V1Deployment")
    assert deploy.spec.replicas == 2
    c = deploy.spec.template.spec.containers[0]
    assert c.readiness_probe.http_get.path == "/healthz" and c.liveness_probe is not None
    agent = load(next(o for o in objects if o["kind"] == "DaemonSet"), "V1DaemonSet")
    mounts = {m.mount_path for m in agent.spec.template.spec.containers[0].volume_mounts}
    assert "/var/lib/kubelet/device-plugins" in mounts
    assert agent.spec.template.spec.containers[0].command[:3] == ["gpupool", "kube", "agent"]


def test_scheduler_config_points_at_the_extender(objects):
    cfg = next(o for o in objects if o["kind"] == "KubeSchedulerConfiguration")
    ext = cfg["extenders"][0]
    assert ext["urlPrefix"].endswith("/extender") and ext["filterVerb"] == "filter"
    assert ext["prioritizeVerb"] == "prioritize" and ext["managedResources"][0]["name"] == "gpupool.io/gpu"


def test_certs_command_writes_a_component(tmp_path):
    out = tmp_path / "tls"
    assert main(["kube", "certs", "--out", str(out)]) == 0
    comp = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert comp["kind"] == "Component"
    assert [g["name"] for g in comp["secretGenerator"]] == [
        "gpupool-webhook-tls",
        "gpupool-agent-ca",
        "gpupool-agent-token",
    ]
    assert (out / "agent-ca.crt").is_file() and (out / "agent-ca.key").stat().st_mode & 0o077 == 0
    patch = yaml.safe_load(comp["patches"][0]["patch"])
    assert patch[0]["path"] == "/webhooks/0/clientConfig/caBundle"
    first_ca = (out / "ca.crt").read_bytes()
    # Rotation: same CA, new serving certificate.
    old = (out / "tls.crt").read_bytes()
    assert (
        main(["kube", "certs", "--out", str(out), "--ca-cert", str(out / "ca.crt"), "--ca-key", str(out / "ca.key")])
        == 0
    )
    assert (out / "ca.crt").read_bytes() == first_ca and (out / "tls.crt").read_bytes() != old


def test_agent_sees_host_pids_and_shares_its_dev_shm(objects):
    agent = load(next(o for o in objects if o["kind"] == "DaemonSet"), "V1DaemonSet")
    spec = agent.spec.template.spec
    assert spec.host_pid is True  # the watchdog maps NVML's host PIDs to container processes
    mounts = {m.name: m.mount_path for m in spec.containers[0].volume_mounts}
    volumes = {v.name: v for v in spec.volumes}
    assert mounts["mps-shm"] == "/dev/shm"
    assert volumes["mps-shm"].host_path.path == "/run/gpupool/mps/shm"


def test_mps_component_patches_apply_and_match_the_webhook_defaults(objects):
    """deploy/mps: its patches apply to the agent and webhook; the folders agree with what pods get."""
    from gpupool.kube.mutate import MutateConfig
    from gpupool.pooling.isolation.mps import mps_dirs

    from .conftest import apply_patch

    component = yaml.safe_load((DEPLOY / "mps" / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    patched = {}
    for entry in component["patches"]:
        target = entry["target"]
        obj = next(o for o in objects if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"])
        patched[target["kind"]] = apply_patch(obj, yaml.safe_load(entry["patch"]))
    agent = load(patched["DaemonSet"], "V1DaemonSet").spec.template.spec
    webhook = load(patched["Deployment"], "V1Deployment").spec.template.spec
    assert "--isolation=mps" in agent.containers[0].args and "--isolation=mps" in webhook.containers[0].args
    state = next(a.split("=", 1)[1] for a in agent.containers[0].args if a.startswith("--state="))
    pipe, _ = mps_dirs(pathlib.Path(state))
    assert f"--mps-pipe-dir={pipe}" in webhook.containers[0].args
    assert str(pipe) == "/var/lib/gpupool/mps/pipe"
    shm = next(v for v in agent.volumes if v.name == "mps-shm").host_path.path
    assert f"--mps-shm-dir={shm}" in webhook.containers[0].args and MutateConfig().mps_shm_dir == shm
    assert {"SETUID", "SETGID"} <= set(agent.containers[0].security_context.capabilities.add)


# KubeSchedulerConfiguration v1's Extender and ExtenderTLSConfig fields (k8s.io/kube-scheduler/config/v1).
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}  # fmt: skip
TLS_FIELDS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"}


def test_scheduler_config_reaches_the_extender_from_the_host_network(capsys):
    """The Service's ClusterIP in the URL (no Service DNS on the host), its DNS name for TLS."""
    from gpupool.kube.certs import service_names
    from gpupool.kube.manifests import scheduler_config

    assert main(["kube", "scheduler-config", "--cluster-ip", "10.96.12.34"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    (ext,) = cfg["extenders"]
    assert set(ext) <= EXTENDER_FIELDS and set(ext["tlsConfig"]) <= TLS_FIELDS
    assert ext["urlPrefix"] == "https://10.96.12.34:443/extender" and ext["enableHTTPS"] is True
    assert ext["tlsConfig"]["serverName"] in service_names("gpupool-webhook", "gpupool-system")
    assert scheduler_config("fd00::1c")["extenders"][0]["urlPrefix"] == "https://[fd00::1c]:443/extender"
    assert main(["kube", "scheduler-config", "--cluster-ip", "gpupool-webhook.gpupool-system.svc"]) == 2
    assert "jsonpath" in capsys.readouterr().err
    # the committed example is this rendering, for its example address
    committed = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    assert committed == scheduler_config("10.96.0.200")
    # the extender's weight: 5 by default (its score then decides among nodes that fit), or as asked
    assert ext["weight"] == 5
    assert main(["kube", "scheduler-config", "--cluster-ip", "10.96.12.34", "--weight", "20"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["extenders"][0]["weight"] == 20
    assert main(["kube", "scheduler-config", "--cluster-ip", "10.96.12.34", "--weight", "0"]) == 2
    assert "--weight 0 must be" in capsys.readouterr().err


def test_extender_answers_at_an_ip_with_the_services_name_checked(tmp_path, cluster):
    """What the scheduler's client does with that config: connect to the IP, verify the name
    against the certificate `gpupool kube certs` writes (the Service's names only)."""
    import json
    import socket
    import ssl

    from gpupool.kube.admission import WebhookApp, serve
    from gpupool.kube.mutate import MutateConfig

    assert main(["kube", "certs", "--out", str(tmp_path)]) == 0
    server = serve(
        "127.0.0.1:0", WebhookApp(MutateConfig(), cluster), str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")
    )
    try:
        ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        raw = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5)
        with ctx.wrap_socket(raw, server_hostname="gpupool-webhook.gpupool-system.svc") as sock:
            body = json.dumps({"Pod": {"metadata": {"name": "p"}, "spec": {"containers": []}}, "NodeNames": []})
            sock.sendall(
                f"POST /extender/filter HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        server.shutdown()
