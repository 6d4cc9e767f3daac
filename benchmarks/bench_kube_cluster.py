"""The local Kubernetes control plane (tools/kube_cluster): how long its components take to build
from their Go modules, and how long the cluster takes to come up and go down.

    python benchmarks/bench_kube_cluster.py [--nodes 4 --gpus 8] [--cold]

--cold builds everything once more into a fresh Go build cache and a fresh bin folder (the
module downloads are kept: the Go module cache is not the build), which takes tens of minutes on
2 cores; without it the cold figure already in the results file is kept and the rest measured.
Where Go is absent it says so and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

from results_file import load_average, write_and_show

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.kube_cluster import controlplane  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "kube-cluster.json"


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo ("" where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")


def cold_build() -> Dict[str, Any]:
    """Every default component, built from nothing but the downloaded modules."""
    with tempfile.TemporaryDirectory(prefix="kube-cold-") as scratch:
        env = {**os.environ, "GOCACHE": f"{scratch}/go-build", "GPUPOOL_KUBE_CACHE": f"{scratch}/bin"}
        began = time.monotonic()
        subprocess.run([str(controlplane.BUILD_SCRIPT)], check=True, env=env, stdout=subprocess.DEVNULL)
        return {"seconds": round(time.monotonic() - began, 1), "load_average_at_end": load_average()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cold", action="store_true", help="measure a cold build too (tens of minutes)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    try:
        began = time.monotonic()
        bin_dir = controlplane.build()
        cached = time.monotonic() - began
    except controlplane.GoMissing as err:
        print(f"bench_kube_cluster: skipped, {err}")
        return 0
    previous: Dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    figures: Dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "platform": platform.platform(),
            "go": subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip(),
            "load_average_at_start": load_average(),
            "note": "2 cores shared with other work; figures are wall-clock seconds",
        },
        "kubernetes": controlplane.KUBE_RELEASE,
        "components": sorted(p.name for p in bin_dir.iterdir()),
        "cold_build": cold_build() if args.cold else previous.get("cold_build"),
        "kueue_cold_build": previous.get("kueue_cold_build"),
        "cached_build_seconds": round(cached, 2),
    }
    with tempfile.TemporaryDirectory(prefix="kube-bench-") as state:
        plane = controlplane.ControlPlane(Path(state), bin_dir)
        try:
            t0 = time.monotonic()
            plane.start_apiserver()
            t1 = time.monotonic()
            plane.start_controllers()
            t2 = time.monotonic()
            plane.add_nodes(args.nodes, args.gpus)
            t3 = time.monotonic()
        finally:
            t4 = time.monotonic()
            plane.stop()
            t5 = time.monotonic()
    figures["up"] = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "etcd_and_apiserver_ready_seconds": round(t1 - t0, 1),
        "controllers_ready_seconds": round(t2 - t1, 1),
        "nodes_ready_seconds": round(t3 - t2, 1),
        "total_seconds": round(t3 - t0, 1),
        "load_average_at_end": load_average(),
    }
    figures["down_seconds"] = round(t5 - t4, 1)
    write_and_show(figures, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
