"""`python -m tools.kube_cluster up|down|build`: `make cluster-up`, `make cluster-down`.

up     builds (or takes from the cache) the components, starts the control plane in the state
       folder with NODES nodes of GPUS GPUs (the last REAL_NODES of them with a real kubelet and
       containerd, the others kwok's), gpupool's own components where
       tools/kube_cluster/gpupool_side.py is there, and prints `export KUBECONFIG=…`.
down   ends every process `up` started there and removes the folder.
build  prints the bin folder (building what is missing).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from . import controlplane, kubelet_node


def live_pids(state: Path) -> List[str]:
    """Names of the components whose pid files in `state` still name a running process."""
    pids = state / "pids"
    names = []
    for pid_file in sorted(pids.glob("*.pid")) if pids.is_dir() else []:
        pid, _, start = pid_file.read_text().strip().partition(" ")
        if pid.isdigit() and controlplane._start_time(int(pid)) == start:
            names.append(pid_file.stem)
    return names


def count(value: str) -> int:
    """A non-negative count from the command line (argparse turns the error into exit 2)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number; e.g. NODES=4 GPUS=8") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is negative; e.g. NODES=4 GPUS=8")
    return number


def down(state: Path, with_gpupool: bool) -> List[str]:
    """End what `up` started in `state` (gpupool's components first), remove the folder, and what
    its real nodes left outside their namespaces."""
    real = kubelet_node.started_in(state / "pids")
    ended: List[str] = []
    if with_gpupool:
        from . import gpupool_side

        ended += gpupool_side.stop_detached(state)
    ended += controlplane.down(state)
    for index in real:
        kubelet_node.clean_up(index)
    return ended


def up(state: Path, nodes: int, gpus: int, with_gpupool: bool, dra: bool, real_nodes: int = 0) -> int:
    running = live_pids(state)
    if running:
        print(
            f"cluster-up: a cluster is already up in {state} ({', '.join(running)}); run `make cluster-down` first",
            file=sys.stderr,
        )
        return 2
    down(state, with_gpupool)  # what a killed `up` left: stale pid files, old certificates
    began = time.monotonic()
    bin_dir = controlplane.build()
    if real_nodes:
        controlplane.build(["kubelet"])
    built = time.monotonic()
    plane = controlplane.ControlPlane(state, bin_dir, detach=True)
    try:
        if with_gpupool:
            from . import gpupool_side

            gpupool_side.bring_up(plane, state, nodes=nodes, gpus=gpus, dra=dra, detach=True, real_nodes=real_nodes)
        else:
            plane.start_apiserver()
            plane.start_controllers()
            plane.add_nodes(nodes, gpus)
    except BaseException:
        plane.stop()
        raise
    done = time.monotonic()
    print(
        f"cluster-up: Kubernetes {controlplane.KUBE_RELEASE} at {plane.server}, {nodes} nodes x {gpus} GPUs "
        f"({real_nodes} with a real kubelet) "
        f"(build/cache {built - began:.1f} s, start {done - built:.1f} s); logs in {plane.logs}",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={plane.admin_kubeconfig}")
    print(f"export PATH={bin_dir}:$PATH  # kubectl {controlplane.KUBE_RELEASE}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kube_cluster", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "build"])
    parser.add_argument(
        "--state", type=Path, default=Path(os.environ.get("CLUSTER_STATE") or controlplane.DEFAULT_STATE)
    )
    parser.add_argument("--nodes", type=count, default=count(os.environ.get("NODES") or "4"))
    parser.add_argument("--gpus", type=count, default=count(os.environ.get("GPUS") or "8"))
    parser.add_argument(
        "--real-nodes",
        type=count,
        default=count(os.environ.get("REAL_NODES") or "0"),
        help="how many of the nodes (the last) run a real kubelet with containerd (REAL_NODES; root, Debian's "
        "containerd, runc, containernetworking-plugins and busybox-static)",
    )
    parser.add_argument(
        "--control-plane-only",
        action="store_true",
        help="start no gpupool component even where tools/kube_cluster/gpupool_side.py exists",
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        default=os.environ.get("DRA") == "1",
        help="node agents with the DRA driver (DRA=1)",
    )
    args = parser.parse_args(argv)
    state = args.state.resolve()
    with_gpupool = not args.control_plane_only and importlib.util.find_spec(f"{__package__}.gpupool_side") is not None
    try:
        if args.command == "build":
            print(controlplane.build())
            return 0
        if args.command == "down":
            ended = down(state, with_gpupool)
            print(f"cluster-down: ended {', '.join(ended) or 'nothing'}; removed {state}", file=sys.stderr)
            return 0
        if args.real_nodes > args.nodes or (args.real_nodes and not with_gpupool):
            print(
                f"cluster-up: REAL_NODES={args.real_nodes} needs gpupool's side and at most NODES={args.nodes} nodes",
                file=sys.stderr,
            )
            return 2
        return up(state, args.nodes, args.gpus, with_gpupool, args.dra, args.real_nodes)
    except controlplane.GoMissing as err:
        print(f"cluster-{args.command}: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(
            f"cluster-{args.command}: tools/kube-cluster/build.sh failed (exit {err.returncode}); its output is above",
            file=sys.stderr,
        )
        return 1
    except controlplane.StartFailed as err:
        print(f"cluster-up: {err}", file=sys.stderr)
        return 1
    except kubelet_node.NodeUnavailable as err:
        print(f"cluster-up: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
