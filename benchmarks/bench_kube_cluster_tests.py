"""gpupool's side of the local Kubernetes cluster: how long the cluster with gpupool's components
takes to come up (tools/kube_cluster.gpupool_side.bring_up: the control plane, the webhook and
extender, the node agents with DRA) and to go down, and how long the `cluster` tests of gpupool's
side take (tests/kube_cluster/, the control plane's and Kueue's own tests left out).

    python benchmarks/bench_kube_cluster_tests.py [--nodes 4 --gpus 8]

Where Go is absent it says so and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

from results_file import load_average, write_and_show

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.kube_cluster import controlplane, gpupool_side  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "kube-cluster-tests.json"
# gpupool's side: the tests of tools/kube_cluster's control plane and of Kueue are timed elsewhere.
TESTS = [
    "test_admission.py",
    "test_scheduling.py",
    "test_deploy.py",
    "test_jobs.py",
    "test_dra.py",
    "test_quickstart.py",
]


def up_and_down(nodes: int, gpus: int) -> Dict[str, float]:
    """One cluster with gpupool's side: seconds to bring it up, and to end every process."""
    state = Path(tempfile.mkdtemp(prefix="gpc-"))
    plane = controlplane.ControlPlane(state, controlplane.build())
    try:
        started = time.monotonic()
        side = gpupool_side.bring_up(plane, state, nodes=nodes, gpus=gpus, dra=True)
        up = time.monotonic() - started
        started = time.monotonic()
        side.stop()
        plane.stop()
        down = time.monotonic() - started
    finally:
        plane.stop()
        shutil.rmtree(state, ignore_errors=True)
    return {"up_seconds": round(up, 1), "down_seconds": round(down, 1)}


def run_tests() -> Dict[str, Any]:
    """The tests of gpupool's side, as `make test` runs them (one session cluster)."""
    paths = [str(ROOT / "tests" / "kube_cluster" / name) for name in TESTS]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    seconds = time.monotonic() - started
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", done.stdout)}
    return {
        "files": TESTS,
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0) + counts.get("error", 0),
        "skipped": counts.get("skipped", 0),
        "seconds": round(seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    try:
        controlplane.build()
    except controlplane.GoMissing as err:
        print(f"bench_kube_cluster_tests: {err}; nothing measured", file=sys.stderr)
        return 0
    figures: Dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_at_start": load_average(),
            "note": "2 cores shared with other work; figures are wall-clock seconds",
        },
        "kubernetes": controlplane.KUBE_RELEASE,
        "cluster": {"nodes": args.nodes, "gpus_per_node": args.gpus, "dra": True},
    }
    figures["cluster"].update(up_and_down(args.nodes, args.gpus))
    figures["tests"] = run_tests()
    figures["machine"]["load_average_at_end"] = load_average()
    write_and_show(figures, OUT)
    return 0 if figures["tests"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
