"""Admission for real: kube-apiserver calls gpupool's mutating and validating webhooks over TLS
(registered by URL with the project's CA as caBundle) on pod creation, and what it stores is the
mutated pod; a share the webhook refuses is refused by the API server with the webhook's own
message; with the webhook stopped (failurePolicy Ignore) pods without GPUs still schedule."""

from __future__ import annotations

import json

import pytest
from waiting import wait_until

from .cluster_fixture import gpu_pod, plain_pod

pytestmark = pytest.mark.cluster

CLAIM, MARKER = "gpupool.io/claim", "gpupool.io/mutated"


def stored(cluster, ns, pod):
    """Create `pod` in `ns` and read back what the API server stored."""
    created = cluster.create_pod(ns, pod)
    return cluster.pod(ns, created["metadata"]["name"])


def test_the_api_server_calls_the_webhook_and_stores_the_mutated_pod(cluster):
    ns = cluster.namespace("adm")
    before = cluster.webhook_calls("mutate")
    half = stored(cluster, ns, gpu_pod("half", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "50"}))
    train = half["spec"]["containers"][0]
    # The user's keys are gone, the units are in: requests equal limits, as extended resources must be.
    assert train["resources"]["limits"] == {"gpupool.io/gpu": "50"}
    assert train["resources"]["requests"] == {"gpupool.io/gpu": "50"}
    assert json.loads(half["metadata"]["annotations"][CLAIM]) == {
        "train": {"amount": 1, "memory_mib": None, "percent": 50}
    }
    # The runner is injected and wraps the command, argv kept.
    assert [c["name"] for c in half["spec"]["initContainers"]] == ["gpupool-runner-install"]
    assert train["command"][-3:] == ["--", "python", "train.py"]
    assert "gpupool-run.pyz" in " ".join(train["command"])
    claim_env = next(e for e in train["env"] if e["name"] == "GPUPOOL_CLAIM")
    assert claim_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['gpupool.io/choice.0']"
    # It was this webhook process that answered (its own count of admission reviews).
    assert cluster.webhook_calls("mutate") >= before + 1


def test_gpu_memory_is_turned_into_units_of_the_clusters_gpus(cluster):
    ns = cluster.namespace("adm")
    pod = stored(cluster, ns, gpu_pod("mem", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-memory": "8Gi"}))
    # 8 GiB of an 80 GiB GPU (what the node agents report) is 10 % = 10 units.
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"gpupool.io/gpu": "10"}
    assert json.loads(pod["metadata"]["annotations"][CLAIM]) == {
        "train": {"amount": 1, "memory_mib": 8192, "percent": None}
    }


def test_bitfusion_pod_specs_are_read_as_aliases(cluster):
    ns = cluster.namespace("adm")
    pod = gpu_pod(
        "bitfusion",
        {"bitfusion.io/gpu-amount": "1", "bitfusion.io/gpu-percent": "25"},
        {"auto-management/bitfusion": "all"},
    )
    got = stored(cluster, ns, pod)
    assert got["spec"]["containers"][0]["resources"]["limits"] == {"gpupool.io/gpu": "25"}
    assert json.loads(got["metadata"]["annotations"][CLAIM]) == {
        "train": {"amount": 1, "memory_mib": None, "percent": 25}
    }
    assert got["metadata"]["annotations"][MARKER]


def test_an_invalid_share_is_refused_with_the_webhooks_message(cluster):
    from kubernetes.client.exceptions import ApiException

    ns = cluster.namespace("adm")
    with pytest.raises(ApiException) as err:
        cluster.create_pod(ns, gpu_pod("too-much", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "150"}))
    body = json.loads(err.value.body)
    assert err.value.status == 403
    assert 'admission webhook "mutate.gpupool.io" denied the request' in body["message"]
    assert "gpupool: container 'train': gpupool.io/gpu-percent '150' is out of range" in body["message"]
    assert "from 1 to 100, e.g. 50" in body["message"]
    assert cluster.pods(ns) == []


def test_a_pod_carrying_a_choice_of_its_own_is_refused_by_the_validating_webhook(cluster):
    from kubernetes.client.exceptions import ApiException

    ns = cluster.namespace("adm")
    forged = gpu_pod("forged", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "10"})
    forged["metadata"]["annotations"]["gpupool.io/choice"] = '{"node":"gpu-node-0","gpus":{"train":["GPU-x"]}}'
    with pytest.raises(ApiException) as err:
        cluster.create_pod(ns, forged)
    assert 'admission webhook "validate.gpupool.io" denied the request' in json.loads(err.value.body)["message"]


def test_with_the_webhook_stopped_pods_without_gpus_still_schedule(cluster):
    ns = cluster.namespace("adm")
    cluster.side.stop_webhook()
    try:
        # failurePolicy Ignore: the API server admits the pod unchanged, kube-scheduler binds it
        # itself (no GPU: the extender is not asked), kwok runs it.
        cluster.create_pod(ns, plain_pod("web"))
        wait_until(lambda: cluster.pod(ns, "web")["status"].get("phase") == "Running", 120, "web to run")
        assert cluster.pod(ns, "web")["spec"]["nodeName"].startswith("gpu-node-")
        # A GPU pod is admitted too, but not translated: it waits, never runs without its share.
        cluster.create_pod(ns, gpu_pod("gpu", {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "50"}))
        untouched = cluster.pod(ns, "gpu")
        assert CLAIM not in (untouched["metadata"].get("annotations") or {})
        assert "gpupool.io/gpu-percent" in untouched["spec"]["containers"][0]["resources"]["limits"]
    finally:
        cluster.side.start_webhook()
        cluster.side.wait_ready()
    assert not cluster.pod(ns, "gpu")["spec"].get("nodeName")
