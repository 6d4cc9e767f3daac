"""`gpupool server`: serve the pool of this machine over HTTP(S)."""

from __future__ import annotations

import argparse
import os


def register(subparsers) -> None:
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
    p.add_argument("--ttl", type=float, default=30.0, metavar="S", help="default lease TTL in seconds (default 30)")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from ..server.serve import ServerConfig, serve

    serve(
        ServerConfig(
            listen=args.listen,
            state_dir=args.state,
            token_file=args.token_file,
            devices=args.devices if args.devices is not None else os.environ.get("GPUPOOL_DEVICES"),
            node=args.node,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_auto=args.tls == "auto",
            tls_names=args.tls_name,
            ttl_s=args.ttl,
            log_level="info" if args.verbose else "warning",
        )
    )
    return 0
