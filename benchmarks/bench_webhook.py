"""Mutating-webhook round trips over HTTPS (1 and 32 keep-alive clients) and extender filter
latency for 1,000 nodes x 8 GPUs. Kubernetes gives a webhook 10 s; the target is p99 < 20 ms.

    python benchmarks/bench_webhook.py [--seconds 5] [--out benchmarks/results/webhook.json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import platform
import random
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Dict, List

from gpupool.core.model import Device
from gpupool.kube import annotations as ann
from gpupool.kube.admission import WebhookApp, serve
from gpupool.kube.certs import write_certs
from gpupool.kube.extender import NodeState, handle_filter
from gpupool.kube.mutate import MutateConfig
from gpupool.kube.nodestate import ClusterState
from gpupool.kube.resources import GpuAsk

POD = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "train", "namespace": "team-a", "annotations": {"gpupool.io/inject": "all"}},
    "spec": {"containers": [{
        "name": "train", "image": "nvcr.io/nvidia/pytorch:24.01-py3", "command": ["python", "/work/train.py"],
        "resources": {"limits": {"gpupool.io/gpu-amount": "1", "gpupool.io/gpu-percent": "50"}},
    }]},
}


def percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def summary(latencies: List[float], seconds: float) -> Dict[str, float]:
    ms = [x * 1000 for x in latencies]
    return {"requests": len(ms), "rps": round(len(ms) / seconds, 1), "p50_ms": round(percentile(ms, 50), 3),
            "p99_ms": round(percentile(ms, 99), 3), "max_ms": round(max(ms), 3),
            "mean_ms": round(statistics.fmean(ms), 3)}


def webhook_round_trips(port: int, ca: str, clients: int, seconds: float) -> Dict[str, float]:
    latencies: List[float] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker() -> None:
        ctx = ssl.create_default_context(cafile=ca)
        conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=30)
        mine = []
        while time.perf_counter() < stop_at:
            body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "request": {"uid": str(uuid.uuid4()), "kind": {"kind": "Pod"},
                                           "operation": "CREATE", "object": POD}})
            t0 = time.perf_counter()
            conn.request("POST", "/mutate", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            mine.append(time.perf_counter() - t0)
            assert resp.status == 200 and b'"allowed":true' in data
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return dict(summary(latencies, time.perf_counter() - start), clients=clients)


def extender_filter(nodes: int, gpus: int, runs: int) -> Dict[str, float]:
    rng = random.Random(7)
    states = {}
    for n in range(nodes):
        devs = tuple(Device(f"GPU-{n}-{i}", i, "A100 80GB", 81920, f"node-{n}") for i in range(gpus))
        states[f"node-{n}"] = NodeState(devs, {d.uuid: rng.choice([0, 20480, 40960, 61440, 81920]) for d in devs})
    pod = {"metadata": {"annotations": {ann.CLAIM: ann.encode_claim({"train": GpuAsk(2, percent=50)})}},
           "spec": {"containers": [{"name": "train"}]}}
    args = {"Pod": pod, "NodeNames": list(states)}
    latencies, passed = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        result = handle_filter(json.loads(json.dumps(args)), states)
        latencies.append(time.perf_counter() - t0)
        passed = len(result["NodeNames"])
    out = summary(latencies, sum(latencies))
    out.pop("rps")
    return dict(out, nodes=nodes, gpus_per_node=gpus, nodes_passing=passed)


def _serve(crt: str, key: str, ports) -> None:
    cluster = ClusterState(lambda: {})
    cluster.set_states({"node-0": NodeState(tuple(Device(f"GPU-{i}", i, "A100", 81920, "node-0")
                                                  for i in range(8)), {})})
    server = serve("127.0.0.1:0", WebhookApp(MutateConfig(), cluster), crt, key)
    ports.put(server.server_address[1])
    threading.Event().wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "webhook.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ca, crt, key = write_certs(tmp, ["localhost"])
        # The server runs in its own process, as in a cluster: clients must not share its GIL.
        ctx = multiprocessing.get_context("spawn")
        ports = ctx.Queue()
        proc = ctx.Process(target=_serve, args=(str(crt), str(key), ports), daemon=True)
        proc.start()
        port = ports.get(timeout=30)
        webhook_round_trips(port, str(ca), 1, 0.5)  # warm-up
        results = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                        "note": "clients and server share these CPUs"},
            "mutate_1_client": webhook_round_trips(port, str(ca), 1, args.seconds),
            "mutate_32_clients": webhook_round_trips(port, str(ca), 32, args.seconds),
            "extender_filter_1000x8": extender_filter(1000, 8, 50),
            "target_p99_ms": 20,
        }
        proc.terminate()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
