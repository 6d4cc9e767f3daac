"""Mutating and validating webhooks through real HTTPS AdmissionReview round trips."""

from __future__ import annotations

import base64
import json

import pytest

from gpupool.kube import annotations as ann

from .conftest import apply_patch, review, to_v1pod

RUNNER = ["python3", "/gpupool/gpupool-run.pyz", "run"]
TAIL = [
    "--wait",
    "300",
    "--server",
    "$(GPUPOOL_SERVER)",
    "--label",
    "pod:$(GPUPOOL_POD_NAMESPACE)/$(GPUPOOL_POD_NAME):$(GPUPOOL_POD_UID)",
    "--",
]


def share(out, index):
    """The ask container `index`'s runner claims: $GPUPOOL_CLAIM is the downward API's copy of the
    claim the extender's bind records for it (gpupool.io/choice.N), placed from the pod's
    gpupool.io/claim; the command carries no share of its own."""
    c = out["spec"]["containers"][index]
    (claim_env,) = [e for e in c["env"] if e["name"] == "GPUPOOL_CLAIM"]
    path = claim_env["valueFrom"]["fieldRef"]["fieldPath"]
    assert path == f"metadata.annotations['{ann.chosen_gpu_key(index)}']"
    assert not {"-n", "-p", "-m"} & set(c.get("command") or [])
    return json.loads(out["metadata"]["annotations"][ann.CLAIM])[c["name"]]


def pod(containers, annotations=None, init=None, volumes=None, name="p"):
    meta = {"name": name, "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = annotations
    spec = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    if volumes is not None:
        spec["volumes"] = volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def gpu(name="train", command=None, args=None, limits=None, **extra):
    c = {"name": name, "image": "nvcr.io/nvidia/pytorch:24.01-py3", **extra}
    if command is not None:
        c["command"] = command
    if args is not None:
        c["args"] = args
    if limits is not None:
        c["resources"] = {"limits": limits}
    return c


def mutate_via_http(client, p):
    rev = review(p)
    status, body = client.post("/mutate", rev)
    assert status == 200
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    resp = body["response"]
    assert resp["uid"] == rev["request"]["uid"]
    patch = json.loads(base64.b64decode(resp["patch"])) if "patch" in resp else []
    if patch:
        assert resp["patchType"] == "JSONPatch"
    return resp, patch


def mutated(client, p):
    """Mutate, apply, check it loads as V1Pod, check a second pass is a no-op; return (pod, response)."""
    resp, patch = mutate_via_http(client, p)
    assert resp["allowed"], resp
    out = apply_patch(p, patch)
    to_v1pod(out)
    again, patch2 = mutate_via_http(client, out)
    assert again["allowed"] and patch2 == []
    status, body = client.post("/validate", review(out))
    assert status == 200 and body["response"]["allowed"], body
    return out, resp


def test_bitfusion_demo_pod(client):
    p = pod(
        [
            gpu(
                "tensorflow-benchmark",
                command=[
                    "python /benchmark/scripts/tf_cnn_benchmarks/tf_cnn_benchmarks.py --local_parameter_device=gpu "
                    "--batch_size=32 --model=inception3"
                ],
                limits={"bitfusion.io/gpu-amount": 1, "bitfusion.io/gpu-percent": 100},
            )
        ],
        annotations={
            "auto-management/bitfusion": "all",
            "bitfusion-client/os": "ubuntu18",
            "bitfusion-client/version": "450",
        },
    )
    out, resp = mutated(client, p)
    c = out["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"gpupool.io/gpu": "100"}, "requests": {"gpupool.io/gpu": "100"}}
    assert c["command"] == RUNNER + TAIL + [
        "/bin/sh",
        "-c",
        p["spec"]["containers"][0]["command"][0],
    ]
    assert share(out, 0) == {"amount": 1, "percent": 100, "memory_mib": None}
    assert any("bitfusion-client/os" in w for w in resp["warnings"])
    assert out["metadata"]["annotations"]["bitfusion-client/os"] == "ubuntu18"  # kept
    assert out["spec"]["initContainers"][0]["name"] == "gpupool-runner-install"


def test_gpupool_pod_half_gpu_preserves_argv(client):
    argv = ["python", "/work/train.py", "--lr", "0.1", "a b", "$(HOME)", ""]
    p = pod(
        [
            gpu(
                command=argv[:2],
                args=argv[2:],
                limits={"gpupool.io/gpu-amount": 1, "gpupool.io/gpu-percent": 50},
                env=[{"name": "LD_LIBRARY_PATH", "value": "/usr/local/cuda/lib64"}, {"name": "A", "value": "1"}],
            )
        ],
        annotations={"gpupool.io/inject": "all", "team": "vision"},
    )
    out, _ = mutated(client, p)
    c = out["spec"]["containers"][0]
    assert c["command"] == RUNNER + TAIL + argv[:2]
    assert share(out, 0) == {"amount": 1, "percent": 50, "memory_mib": None}
    assert c["args"] == argv[2:]
    assert c["resources"]["requests"] == {"gpupool.io/gpu": "50"}
    env = {e["name"]: e for e in c["env"]}
    assert env["LD_LIBRARY_PATH"]["value"] == "/usr/local/cuda/lib64:/gpupool/lib"
    assert env["A"]["value"] == "1"
    assert env["GPUPOOL_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["GPUPOOL_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    names = [e["name"] for e in c["env"]]
    assert names.index("GPUPOOL_NODE_IP") < names.index("GPUPOOL_SERVER")
    assert out["metadata"]["annotations"]["team"] == "vision"
    assert json.loads(out["metadata"]["annotations"][ann.CLAIM]) == {
        "train": {"amount": 1, "percent": 50, "memory_mib": None}
    }
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/gpupool", "/etc/gpupool"} <= mounts
    vols = {v["name"]: v for v in out["spec"]["volumes"]}
    assert vols["gpupool-token"]["secret"] == {"secretName": "gpupool-client", "optional": True}


def test_memory_rounded_against_gpu_size(client):
    # 8Gi on the 16 GiB GPUs of node-a: 50 units per GPU, two GPUs.
    p = pod([gpu(command=["python", "t.py"], limits={"gpupool.io/gpu-amount": "2", "gpupool.io/gpu-memory": "8Gi"})])
    out, _ = mutated(client, p)
    c = out["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"gpupool.io/gpu": "100"}
    assert share(out, 0) == {"amount": 2, "percent": None, "memory_mib": 8192}


def test_multi_container_and_existing_init_containers(client):
    p = pod(
        [
            gpu(
                "a",
                command=["python", "a.py"],
                limits={"gpupool.io/gpu-amount": 1, "gpupool.io/gpu-percent": 25, "cpu": "2"},
            ),
            {"name": "sidecar", "image": "busybox", "command": ["sleep", "inf"]},
            gpu("b", command=["python", "b.py"], limits={"gpupool.io/gpu-amount": 2, "gpupool.io/gpu-percent": 10}),
        ],
        init=[{"name": "fetch", "image": "busybox", "command": ["true"]}],
        volumes=[{"name": "data", "emptyDir": {}}],
        annotations={},
    )
    out, _ = mutated(client, p)
    a, side, b = out["spec"]["containers"]
    assert a["resources"]["limits"] == {"cpu": "2", "gpupool.io/gpu": "25"}
    assert b["resources"]["limits"] == {"gpupool.io/gpu": "20"}
    assert side == p["spec"]["containers"][1]
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["gpupool-runner-install", "fetch"]
    assert [v["name"] for v in out["spec"]["volumes"]] == ["data", "gpupool-runner", "gpupool-token"]


def test_comma_list_wraps_only_named_containers(client):
    p = pod(
        [
            gpu("a", command=["x"], limits={"gpupool.io/gpu-amount": 1}),
            gpu("b", command=["y"], limits={"gpupool.io/gpu-amount": 1}),
        ],
        annotations={"gpupool.io/inject": "b"},
    )
    out, _ = mutated(client, p)
    assert out["spec"]["containers"][0]["command"] == ["x"]
    assert out["spec"]["containers"][1]["command"][-1] == "y"
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"gpupool.io/gpu": "100"}


def test_args_only_and_injection_only(client):
    out, resp = mutated(client, pod([gpu(args=["python", "t.py"], limits={"gpupool.io/gpu-percent": 30})]))
    c = out["spec"]["containers"][0]
    assert c["command"] == RUNNER + TAIL and c["args"] == ["python", "t.py"]
    assert share(out, 0) == {"amount": 1, "percent": 30, "memory_mib": None}
    assert any("ENTRYPOINT" in w for w in resp["warnings"])
    out, _ = mutated(
        client, pod([gpu(limits={"gpupool.io/gpu-percent": 30})], annotations={"gpupool.io/inject": "injection-only"})
    )
    assert "command" not in out["spec"]["containers"][0]
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"gpupool.io/gpu": "30"}


def test_pods_without_gpu_and_other_operations_pass_untouched(client):
    p = pod([{"name": "web", "image": "nginx"}])
    resp, patch = mutate_via_http(client, p)
    assert resp["allowed"] and patch == []
    resp, patch = mutate_via_http(
        client, pod([gpu(limits={"gpupool.io/gpu-amount": 1})], annotations={"gpupool.io/inject": "none"})
    )
    assert resp["allowed"] and patch == []
    status, body = client.post("/mutate", review(pod([gpu(limits={"gpupool.io/gpu-amount": 1})]), "UPDATE"))
    assert status == 200 and body["response"]["allowed"] and "patch" not in body["response"]


@pytest.mark.parametrize(
    "limits, annotations, words",
    [
        ({"gpupool.io/gpu-amount": 1, "gpupool.io/gpu-percent": 50}, {}, ["neither command nor args", "command:"]),
        ({"gpupool.io/gpu-amount": 0, "gpupool.io/gpu-percent": 50}, {}, ["gpu-amount", ">= 1"]),
        ({"gpupool.io/gpu-amount": "1.5"}, {}, ["gpu-amount", "whole number"]),
        ({"gpupool.io/gpu-percent": 150}, {}, ["gpu-percent", "1 to 100"]),
        ({"gpupool.io/gpu-percent": 0}, {}, ["gpu-percent", "1 to 100"]),
        ({"gpupool.io/gpu-memory": "0"}, {}, ["gpu-memory", "greater than zero"]),
        ({"gpupool.io/gpu-memory": "lots"}, {}, ["gpu-memory", "8Gi"]),
        ({"gpupool.io/gpu-percent": 50, "gpupool.io/gpu-memory": "8Gi"}, {}, ["not both"]),
        ({"gpupool.io/gpu-amount": 1, "gpupool.io/gpu-fraction": 5}, {}, ["gpupool.io/gpu-fraction", "unknown"]),
        ({"gpupool.io/gpu-amount": 1}, {"bitfusion-client/filter": "colour=red"}, ["bitfusion-client/filter"]),
        ({"gpupool.io/gpu-amount": 1}, {"gpupool.io/policy": "random"}, ["gpupool.io/policy", "binpack"]),
        # Issue 34 item 5: numbers of any length are named cut short, never a 500 or a CPU held.
        ({"gpupool.io/gpu-amount": 1}, {"gpupool.io/filter": "device.index=" + "9" * 5000}, ["filter", "more char"]),
        ({"gpupool.io/gpu-memory": "9" * 5000}, {}, ["gpu-memory", "too long for a size", "more characters]"]),
        ({"gpupool.io/gpu-memory": "1e999999999"}, {}, ["gpu-memory", "beyond e30"]),
    ],
)
def test_bad_values_are_denied_with_the_fix(client, limits, annotations, words):
    command = None if "neither command nor args" in words else ["python", "t.py"]
    p = pod([gpu(command=command, limits=limits)], annotations=annotations)
    resp, patch = mutate_via_http(client, p)
    assert not resp["allowed"] and patch == []
    assert resp["status"]["code"] == 403
    for w in words:
        assert w in resp["status"]["message"], resp["status"]["message"]
    # The validating webhook says the same about the untranslated pod (mutating webhook down).
    status, body = client.post("/validate", review(p))
    assert status == 200 and not body["response"]["allowed"]


@pytest.mark.parametrize(
    "limits, words",
    [
        ({"gpupool.io/gpu-amount": 5, "gpupool.io/gpu-percent": 50}, ["no node", "could ever hold"]),
        ({"gpupool.io/gpu-amount": 1, "gpupool.io/gpu-memory": "80Gi"}, ["gpu-memory", "largest GPU", "40GiB"]),
    ],
)
def test_requests_no_node_could_hold_are_denied(client, limits, words):
    p = pod([gpu(command=["python", "t.py"], limits=limits)])
    resp, patch = mutate_via_http(client, p)
    assert resp["allowed"]
    status, body = client.post("/validate", review(apply_patch(p, patch)))
    assert not body["response"]["allowed"]
    for w in words:
        assert w in body["response"]["status"]["message"], body["response"]["status"]["message"]


def test_untranslated_pod_with_injection_none_is_denied(client):
    p = pod([gpu(command=["x"], limits={"gpupool.io/gpu-amount": 1})], annotations={"gpupool.io/inject": "none"})
    status, body = client.post("/validate", review(p))
    assert not body["response"]["allowed"]
    assert "gpupool.io/inject: all" in body["response"]["status"]["message"]


def test_gpu_in_init_container_is_denied(client):
    p = pod(
        [gpu(command=["x"], limits={"gpupool.io/gpu-amount": 1})],
        init=[gpu("prep", command=["y"], limits={"gpupool.io/gpu-percent": 10})],
    )
    resp, _ = mutate_via_http(client, p)
    assert not resp["allowed"] and "init container 'prep'" in resp["status"]["message"]


def test_bad_http_input_gets_4xx_not_500(client):
    assert client.post("/mutate", {"kind": "AdmissionReview"})[0] == 400
    # Malformed reviews are refused whole, not answered with a 500 or an echoed bad uid.
    assert client.post("/mutate", {"request": {"uid": ["u"], "object": {}}})[0] == 400
    status, body = client.post("/validate", {"request": {"uid": "u", "kind": "Pod", "object": {}}})
    assert status == 400 and "request.kind" in body["error"]["message"]
    assert client.post("/nowhere", {})[0] == 404
    client.conn.request("POST", "/validate", b"{not json", {"Content-Type": "application/json"})
    resp = client.conn.getresponse()
    assert resp.status == 400 and b"not valid JSON" in resp.read()  # server.wire.json_object's words
    assert client.get("/healthz") == (200, {"status": "ok", "nodes": 2})
