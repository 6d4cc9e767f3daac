"""Kubernetes and Kubeflow rendering: valid objects for the kubernetes client's models, env per replica."""

import json
import re
import subprocess

import pytest
import yaml

from gpupool.jobs.manifests import render_indexed, render_kubeflow
from gpupool.jobs.spec import parse_spec
from gpupool.kube.resources import GpuAsk, read_ask

kubernetes = pytest.importorskip("kubernetes")
from kubernetes import client as k8s  # noqa: E402


def check_model(data, type_name, path="$"):
    """Every key of `data` must be a field of the client model `type_name`, recursively."""
    if type_name in ("str", "int", "bool", "float", "object", "datetime"):
        if type_name == "str":
            assert isinstance(data, str), f"{path}: {data!r} is not a string"
        if type_name == "int":
            assert isinstance(data, int) and not isinstance(data, bool), f"{path}: {data!r} is not an int"
        return
    m = re.match(r"(?:list|List)\[(.+)\]$", type_name)
    if m:
        assert isinstance(data, list), path
        for i, item in enumerate(data):
            check_model(item, m.group(1), f"{path}[{i}]")
        return
    m = re.match(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])$", type_name)
    if m:
        assert isinstance(data, dict), path
        for k, v in data.items():
            check_model(v, m.group(1) or m.group(2), f"{path}.{k}")
        return
    model = getattr(k8s, type_name)
    by_json = {v: k for k, v in model.attribute_map.items()}
    assert isinstance(data, dict), f"{path}: expected {type_name}"
    for key, value in data.items():
        assert key in by_json, f"{path}.{key} is not a field of {type_name}"
        check_model(value, model.openapi_types[by_json[key]], f"{path}.{key}")


def deserialize(obj, type_name):
    api = k8s.ApiClient()
    return api._ApiClient__deserialize(obj, type_name)


PT = {
    "name": "digits-ddp",
    "framework": "pytorch",
    "restartPolicy": "ExitCode",
    "backoffLimit": 2,
    "activeDeadlineSeconds": 600,
    "roles": {
        "master": {"command": ["python", "train.py"], "gpu": {"fraction": 0.5}},
        "worker": {"replicas": 2, "command": ["python", "train.py"], "gpu": {"count": 1, "memory": "4Gi"}},
    },
}
TF = {
    "name": "mnist-ps",
    "framework": "tensorflow",
    "successPolicy": "allWorkers",
    "roles": {
        "chief": {"command": ["python", "t.py"], "gpu": {"fraction": 0.25, "filters": ["device.name=*A100*"]}},
        "worker": {"replicas": 2, "command": ["python", "t.py"]},
        "ps": {"command": ["python", "t.py"]},
        "evaluator": {"command": ["python", "e.py"]},
    },
}


def env_of(job):
    return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def expand_like_kubelet(job, index):
    """The env a pod of completion `index` sees: $(VAR) expanded in list order, as the kubelet does."""
    values = {}
    for e in job["spec"]["template"]["spec"]["containers"][0]["env"]:
        if "valueFrom" in e:
            values[e["name"]] = str(index)
            continue
        values[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), m.group(0)), e["value"])
    return values


def test_indexed_objects_are_valid_models():
    for data in (PT, TF):
        objs = render_indexed(parse_spec(data))
        assert objs[0]["kind"] == "Service" and objs[0]["spec"]["clusterIP"] == "None"
        check_model(objs[0], "V1Service")
        assert isinstance(deserialize(objs[0], "V1Service"), k8s.V1Service)
        for job in objs[1:]:
            check_model(job, "V1Job")
            model = deserialize(job, "V1Job")
            assert model.spec.completion_mode == "Indexed"
            assert model.spec.template.spec.subdomain == data["name"]


def test_indexed_resources_policies_and_names():
    svc, master, worker = render_indexed(parse_spec(PT))
    assert [master["metadata"]["name"], worker["metadata"]["name"]] == ["digits-ddp-master", "digits-ddp-worker"]
    assert worker["spec"]["completions"] == worker["spec"]["parallelism"] == 2
    limits = master["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "50"}
    wlimits = worker["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert wlimits["gpupool.io/gpu-memory"] == "4096Mi"
    assert master["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert master["spec"]["podFailurePolicy"]["rules"][0]["action"] == "FailJob"
    assert master["spec"]["backoffLimit"] == 2 and master["spec"]["activeDeadlineSeconds"] == 600


def test_indexed_gpu_limits_read_back_by_the_webhook():
    # one resource model: what a job manifest writes is what the mutating webhook reads
    _, master, worker = render_indexed(parse_spec(PT))
    asks = [read_ask(obj["spec"]["template"]["spec"]["containers"][0]) for obj in (master, worker)]
    assert asks == [(GpuAsk(1, percent=50), []), (GpuAsk(1, memory_mib=4096), [])]


def test_torch_env_per_replica_on_kubernetes():
    _, master, worker = render_indexed(parse_spec(PT))
    m = expand_like_kubelet(master, 0)
    assert m["RANK"] == "0" and m["WORLD_SIZE"] == "3"
    assert m["MASTER_ADDR"] == "digits-ddp-master-0.digits-ddp" and m["MASTER_PORT"] == "23456"
    assert m["GPUPOOL_REPLICA"] == "master-0"
    # Workers come after the master: RANK = index + 1, computed by the shell wrapper.
    cmd = worker["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[:2] == ["/bin/sh", "-c"] and cmd[-2:] == ["python", "train.py"]
    for index in (0, 1):
        env = expand_like_kubelet(worker, index)
        assert "RANK" not in env
        out = subprocess.run(
            cmd[:3] + ["sh", "sh", "-c", "echo $RANK $PET_NODE_RANK $GROUP_RANK"],
            env={"GPUPOOL_REPLICA_INDEX": str(index), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert out == [str(index + 1)] * 3
        assert env["MASTER_ADDR"] == "digits-ddp-master-0.digits-ddp" and env["WORLD_SIZE"] == "3"


def test_tf_config_per_replica_on_kubernetes():
    objs = render_indexed(parse_spec(TF))
    by_role = {o["metadata"]["labels"].get("gpupool.io/replica-role"): o for o in objs[1:]}
    cluster = {
        "chief": ["mnist-ps-chief-0.mnist-ps:2222"],
        "worker": ["mnist-ps-worker-0.mnist-ps:2222", "mnist-ps-worker-1.mnist-ps:2222"],
        "ps": ["mnist-ps-ps-0.mnist-ps:2222"],
    }
    for role, count in (("chief", 1), ("worker", 2), ("ps", 1), ("evaluator", 1)):
        for index in range(count):
            cfg = json.loads(expand_like_kubelet(by_role[role], index)["TF_CONFIG"])
            assert cfg == {"cluster": cluster, "task": {"type": role, "index": index}}
    chief = by_role["chief"]["spec"]["template"]
    assert chief["metadata"]["annotations"]["gpupool.io/filter"] == "device.name=*A100*"


def test_kubeflow_tfjob_and_pytorchjob():
    (tfjob,) = render_kubeflow(parse_spec(TF))
    assert tfjob["apiVersion"] == "kubeflow.org/v1" and tfjob["kind"] == "TFJob"
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "Worker", "PS", "Evaluator"} and specs["Worker"]["replicas"] == 2
    assert tfjob["spec"]["successPolicy"] == "AllWorkers"
    for rs in specs.values():
        check_model(rs["template"], "V1PodTemplateSpec")
        assert rs["template"]["spec"]["containers"][0]["name"] == "tensorflow"
        assert "TF_CONFIG" not in {e["name"] for e in rs["template"]["spec"]["containers"][0]["env"]}
    (ptjob,) = render_kubeflow(parse_spec(PT))
    rs = ptjob["spec"]["pytorchReplicaSpecs"]
    assert rs["Master"]["replicas"] == 1 and rs["Worker"]["replicas"] == 2
    assert rs["Master"]["restartPolicy"] == "ExitCode" and ptjob["spec"]["runPolicy"]["backoffLimit"] == 2
    workers_only = dict(PT, roles={"worker": {"replicas": 3, "command": ["x"]}})
    rs = render_kubeflow(parse_spec(workers_only))[0]["spec"]["pytorchReplicaSpecs"]
    assert rs["Master"]["replicas"] == 1 and rs["Worker"]["replicas"] == 2
    for r in rs.values():
        check_model(r["template"], "V1PodTemplateSpec")


def test_kubeflow_refuses_horovod():
    from gpupool.core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="--target kubernetes"):
        render_kubeflow(parse_spec({"name": "h", "framework": "horovod", "roles": {"worker": {"command": ["x"]}}}))


@pytest.mark.parametrize("target", ["kubernetes", "kubeflow"])
def test_cli_dry_run_prints_yaml(target, capsys):
    from gpupool.cli.main import main

    assert main(["submit", "examples/digits-ddp.yaml", "--target", target, "--dry-run", "--namespace", "ml"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs and all(d["metadata"]["namespace"] == "ml" for d in docs)
