"""`gpupool server`: serve the pool of this machine over HTTP(S)."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..serving.server.serve import NodeEnforcement


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ..core.model import DEFAULT_PREEMPT_GRACE_S

    p = subparsers.add_parser(
        "server",
        help="serve this machine's GPUs to clients over HTTP(S)",
        description="Serve the GPU pool of this machine. Auth (--token-file) is required on non-loopback addresses.",
    )
    p.add_argument("--listen", default="127.0.0.1:56001", metavar="HOST:PORT", help="address (default 127.0.0.1:56001)")
    p.add_argument(
        "--state",
        default=os.environ.get("GPUPOOL_STATE", "/var/lib/gpupool"),
        metavar="DIR",
        help="state dir with pool.db (default: $GPUPOOL_STATE or /var/lib/gpupool)",
    )
    p.add_argument("--token-file", metavar="FILE", help="admin token file, created (mode 0600) when absent")
    p.add_argument(
        "--devices",
        metavar="SPEC",
        help="auto (NVML), emulated:2x16GiB[,1x80GiB] or auto,emulated:... (default: $GPUPOOL_DEVICES, "
        "else the devices already in the state dir, else NVML)",
    )
    p.add_argument("--node", default="", help="node name shown in status and used in emulated UUIDs")
    p.add_argument("--tls-cert", metavar="PEM", help="server certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="server private key")
    p.add_argument("--tls", choices=["auto", "off"], default="off", help="auto: self-signed CA + cert in STATE/tls")
    p.add_argument("--tls-name", action="append", default=[], metavar="NAME", help="extra host name for --tls auto")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="without --token-file the server answers requests whose Host is its listen address or localhost only; "
        "add NAME (a local proxy's host name) to those (repeatable)",
    )
    p.add_argument("--ttl", type=float, default=30.0, metavar="S", help="default lease TTL in seconds (default 30)")
    p.add_argument(
        "--preempt-grace",
        type=float,
        default=DEFAULT_PREEMPT_GRACE_S,
        metavar="S",
        help="seconds a preempted job gets between SIGTERM and SIGKILL, unless its claim names its own "
        f"(default {DEFAULT_PREEMPT_GRACE_S:g})",
    )
    add_preempt_argument(p)
    add_enforcement_arguments(p)
    p.set_defaults(func=handle)


def add_preempt_argument(p: argparse.ArgumentParser) -> None:
    """--preempt: what preempting a borrowing lease does in a queue that does not say (the server and the agent)."""
    from ..core.suspension import DEFAULT_PREEMPT_MODE, PREEMPT_MODES

    p.add_argument(
        "--preempt",
        choices=PREEMPT_MODES,
        default=DEFAULT_PREEMPT_MODE,
        help="what preempting a borrowing lease does, in queues that do not say (gpupool queue set --preempt): "
        "suspend (park its GPU state in host memory, resume it when there is room; default), requeue (stop it "
        "and run it again) or kill (stop it)",
    )


def add_enforcement_arguments(p: argparse.ArgumentParser) -> None:
    """--isolation and the watchdog's flags, shared by `gpupool server` and the node agent."""
    modes = ("kill", "warn", "off")
    p.add_argument(
        "--isolation",
        choices=("mps", "hooks", "none"),
        default="hooks",
        help="how leases are held to their share: mps (CUDA MPS daemon, driver-enforced), "
        "hooks (env + import hook, default) or none",
    )
    p.add_argument(
        "--enforce",
        choices=modes,
        default="kill",
        help="a lease using more GPU memory than its share past the grace period: kill (default), warn or off",
    )
    p.add_argument(
        "--enforce-unleased",
        choices=modes,
        default="warn",
        help="a process on a pooled GPU that belongs to no lease: kill, warn (default) or off",
    )
    p.add_argument("--enforce-grace", type=float, default=5.0, metavar="S", help="seconds before acting (default 5)")
    p.add_argument(
        "--usage-interval", type=float, default=1.0, metavar="S", help="seconds between GPU usage samples (default 1)"
    )
    p.add_argument(
        "--idle-suspend",
        default="",
        metavar="DURATION",
        help="suspend a lease once its processes kept its GPUs 0%% busy this long (e.g. 30m; a run's own "
        "--idle-suspend wins); default: never",
    )


def node_enforcement(args: argparse.Namespace) -> NodeEnforcement:
    """The settings of `add_enforcement_arguments`."""
    from ..serving.server.serve import NodeEnforcement

    return NodeEnforcement(
        isolation=args.isolation,
        enforce=args.enforce,
        enforce_unleased=args.enforce_unleased,
        enforce_grace_s=args.enforce_grace,
        usage_interval_s=args.usage_interval,
        idle_suspend=args.idle_suspend,
    )


def handle(args: argparse.Namespace) -> int:
    from ..jobs.executors.local.dashboard import reader
    from ..pooling.isolation.env import DEVICES_ENV
    from ..serving.server.serve import ServerConfig, serve

    serve(
        ServerConfig(
            listen=args.listen,
            state_dir=args.state,
            token_file=args.token_file,
            devices=args.devices,
            devices_env=os.environ.get(DEVICES_ENV),
            node=args.node,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_auto=args.tls == "auto",
            tls_names=args.tls_name,
            allow_hosts=args.allow_host,
            ttl_s=args.ttl,
            preempt_grace_s=args.preempt_grace,
            preempt_mode=args.preempt,
            log_level="info" if args.verbose else "warning",
            enforcement=node_enforcement(args),
            jobs=reader(args.state),  # jobs submitted into this state dir show on the dashboard
        )
    )
    return 0
