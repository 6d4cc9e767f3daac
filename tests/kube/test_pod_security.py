"""What a cluster operator's admission rules meet: Pod Security "baseline" for every generated
pod (as the webhook leaves it, too), seccomp and no privilege escalation, cpu/memory requests
from the spec, an image for every example, and a warning when a cluster target has none."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from gpupool.cli.main import main
from gpupool.core.errors import InvalidInput
from gpupool.jobs.manifests import render_indexed, render_kubeflow
from gpupool.jobs.manifests.indexed import DEFAULT_CPU, DEFAULT_MEMORY
from gpupool.jobs.spec import load_spec, parse_spec, roles_without_image, spec_to_dict
from gpupool.kube.mutate import MutateConfig, mutate

from .conftest import apply_patch as apply_json_patch

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# Pod Security Standards, "baseline": capabilities a container may add.
BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip


def pod_templates(obj: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    spec = obj["spec"]
    if obj["kind"] in ("Job", "Deployment", "DaemonSet"):
        yield spec["template"]
    for key in ("tfReplicaSpecs", "pytorchReplicaSpecs"):
        for replica in (spec.get(key) or {}).values():
            yield replica["template"]


def baseline_violations(pod: Dict[str, Any]) -> List[str]:
    """The Pod Security Standards' baseline checks (kubernetes.io/docs/concepts/security/pod-security-standards)."""
    out = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(key)
    if (pod.get("securityContext") or {}).get("seccompProfile", {}).get("type") == "Unconfined":
        out.append("seccompProfile Unconfined")
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            out.append(f"hostPath volume {volume['name']}")
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        extra = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPS
        if extra:
            out.append(f"{c['name']}: adds {sorted(extra)}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{c['name']}: hostPort")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{c['name']}: seccompProfile Unconfined")
    return out


def rendered() -> List[Dict[str, Any]]:
    out = []
    for path in EXAMPLES:
        spec = load_spec(str(path))
        out += render_indexed(spec)
        if spec.framework.value in ("tensorflow", "pytorch"):
            out += render_kubeflow(spec)
    return out


def test_generated_pods_meet_baseline_with_seccomp_and_no_escalation():
    templates = [t for o in rendered() for t in pod_templates(o)]
    assert len(templates) >= 10
    for template in templates:
        pod = template["spec"]
        assert baseline_violations(pod) == []
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in (pod.get("initContainers") or []) + pod["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]


def test_webhook_keeps_generated_pods_at_baseline():
    """The webhook's injection (runner init container, volumes) adds nothing baseline forbids."""
    spec = load_spec(str(next(p for p in EXAMPLES if p.name == "digits-ddp.yaml")))
    (job,) = [o for o in render_indexed(spec) if o["kind"] == "Job"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        **job["spec"]["template"],
    }
    pod["metadata"] = {"name": "p", "namespace": "team-a", **job["spec"]["template"]["metadata"]}
    patched = apply_json_patch(pod, mutate(pod, MutateConfig()).patch)
    assert len(patched["spec"]["initContainers"]) == 2  # gpupool's runner, then the spec's setup
    assert baseline_violations(patched["spec"]) == []
    runner = patched["spec"]["initContainers"][0]["securityContext"]
    assert runner["seccompProfile"] == {"type": "RuntimeDefault"} and runner["runAsNonRoot"] is True


def test_role_resources_become_requests_and_a_memory_limit():
    data = {
        "name": "res",
        "framework": "pytorch",
        "image": "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime",
        "roles": {
            "master": {"command": ["t"], "resources": {"cpu": 4, "memory": "16Gi"}, "gpu": {"memory": "8G"}},
            "worker": {"replicas": 2, "command": ["t"], "resources": {"cpu": "500m"}},
        },
    }
    spec = parse_spec(data)
    jobs = {o["metadata"]["name"]: o for o in render_indexed(spec) if o["kind"] == "Job"}
    master = jobs["res-master"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert master == {
        "requests": {"cpu": "4", "memory": "16384Mi"},
        "limits": {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-memory": "7629Mi", "memory": "16384Mi"},
    }
    worker = jobs["res-worker"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert worker == {"requests": {"cpu": "500m", "memory": DEFAULT_MEMORY}}
    assert parse_spec(spec_to_dict(spec)) == spec  # the stored spec reads back the same
    (pt,) = render_kubeflow(spec)
    assert pt["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"] == master
    default = parse_spec({**data, "roles": {"master": {"command": ["t"]}}})
    (job,) = [o for o in render_indexed(default) if o["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": DEFAULT_CPU, "memory": DEFAULT_MEMORY}
    }


@pytest.mark.parametrize(
    "resources, words",
    [
        ({"cpu": "lots"}, ["roles.worker.resources.cpu", "500m"]),
        ({"cpu": 0}, ["cpu"]),
        ({"memory": "8000m"}, ["roles.worker.resources", "8000Mi"]),
        ({"gpus": 1}, ["gpus"]),
        ("2 cores", ["mapping"]),
    ],
)
def test_bad_role_resources_name_the_field_and_fix(resources, words):
    data = {"name": "bad", "roles": {"worker": {"command": ["t"], "resources": resources}}}
    with pytest.raises(InvalidInput) as err:
        parse_spec(data)
    for word in words:
        assert word in err.value.message


def test_every_example_names_an_image():
    for path in EXAMPLES:
        assert roles_without_image(load_spec(str(path))) == [], path.name


def test_submit_warns_when_a_cluster_target_has_no_image(tmp_path, capsys):
    spec = {
        "name": "noimg",
        "framework": "tensorflow",
        "roles": {"worker": {"replicas": 2, "command": ["python", "t.py"]}},
    }
    path = tmp_path / "noimg.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["submit", str(path), "--target", "kubernetes", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "names no image for worker" in err and "python:3.11-slim" in err and "no TensorFlow" in err
    assert main(["submit", str(path), "--target", "local", "--dry-run"]) == 0
    assert "image" not in capsys.readouterr().err  # local processes need no image


def test_agent_namespace_admits_the_agent():
    (ns,) = [d for d in yaml.safe_load_all((DEPLOY / "namespace.yaml").read_text()) if d]
    labels = ns["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    (agent,) = [d for d in yaml.safe_load_all((DEPLOY / "agent.yaml").read_text()) if d and d["kind"] == "DaemonSet"]
    pod = agent["spec"]["template"]["spec"]
    assert baseline_violations(pod)  # why the namespace must be privileged: host network, PIDs, paths
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (webhook,) = [
        d for d in yaml.safe_load_all((DEPLOY / "webhook.yaml").read_text()) if d and d["kind"] == "Deployment"
    ]
    assert baseline_violations(webhook["spec"]["template"]["spec"]) == []
