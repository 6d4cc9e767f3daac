"""`gpupool submit JOB.yaml`: validate a job spec and run it locally or on Kubernetes."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..jobs.executors import TARGETS

if TYPE_CHECKING:
    from ..jobs.spec import JobSpec
from .pool_options import add_pool_arguments


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "submit",
        help="run a (distributed) training job from a YAML spec",
        description="Validate a job spec, claim every replica's GPUs as one gang and run the replicas "
        "with TF_CONFIG / torchrun / Horovod env; locally, or as Kubernetes manifests.",
    )
    parser.add_argument("spec", help="job spec YAML (see examples/digits-ddp.yaml)")
    parser.add_argument(
        "--target",
        default="local",
        choices=TARGETS,
        help="local processes (default), a Kubernetes Indexed Job + headless Service, or a Kubeflow TFJob/PyTorchJob",
    )
    parser.add_argument("--dry-run", action="store_true", help="print exactly what would be submitted, start nothing")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="stream the replicas' logs until the job ends; Ctrl-C cancels it"
    )
    parser.add_argument("--namespace", help="Kubernetes namespace (default: the spec's, else 'default')")
    parser.add_argument(
        "--kube-version",
        metavar="1.N",
        help="render for this Kubernetes release (1.28+), leaving out what it lacks (Job successPolicy "
        "before 1.31); default: the API server's version when submitting, the newest with --dry-run",
    )
    parser.add_argument(
        "--ttl",
        type=float,
        default=30.0,
        help="lease TTL in seconds: how long GPUs stay held if the supervisor dies (default 30)",
    )
    add_pool_arguments(parser)
    parser.set_defaults(func=_submit)


def _submit(args: argparse.Namespace) -> int:
    from ..jobs.executors import get_executor
    from ..jobs.spec import load_spec

    spec = load_spec(args.spec)
    if args.target != "local":
        _warn_without_image(spec)
    if args.devices:
        os.environ["GPUPOOL_DEVICES"] = args.devices  # the supervisor inherits it
    executor = get_executor(
        args.target,
        state_dir=Path(args.state).expanduser() if args.state else None,
        servers=args.server or [],
        ttl_s=args.ttl,
        namespace=args.namespace,
        kube_version=args.kube_version,
    )
    info = executor.dryrun(spec)
    if args.dry_run:
        sys.stdout.write(str(info))
        return 0
    name = executor.schedule(info)
    if args.target == "local":  # its gang claims from the servers named, else the state dir's pool
        from .pool_options import print_pool

        print_pool(args.server or f"embedded:{executor.store.state_dir}", sys.stderr)  # type: ignore[attr-defined]
    print(f"job {name} submitted ({args.target}); follow it with: gpupool logs {name} -f", file=sys.stderr)
    if not args.follow:
        return 0
    from .jobs import follow_to_end

    return follow_to_end(executor, name)


def _warn_without_image(spec: JobSpec) -> None:
    """A cluster runs a role without an image on a bare Python image: say so before it fails there."""
    from ..jobs.manifests.indexed import DEFAULT_IMAGE
    from ..jobs.spec import roles_without_image

    missing = roles_without_image(spec)
    if missing:
        needs = {"tensorflow": "TensorFlow", "pytorch": "PyTorch", "horovod": "Horovod"}.get(spec.framework.value)
        lacks = f"no {needs} and none of your code" if needs else "none of your code or libraries"
        print(
            f"gpupool: warning: job {spec.name!r} names no image for {', '.join(missing)}: on a cluster "
            f"{'they run' if len(missing) > 1 else 'it runs'} {DEFAULT_IMAGE}, which has {lacks}; "
            "set image: in the spec (or per role)",
            file=sys.stderr,
        )
