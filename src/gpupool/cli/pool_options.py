"""The flags that choose a pool and its token, shared by the client verbs (`run`, `status`, `list-gpus`, ...)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: making a TypedDict class costs every `gpupool run` at start
    from typing import IO, Iterable, List, Optional, TypedDict, Union

    from ..workload.client.base import PoolClient

    # What names a pool for `print_pool`: its address ("embedded:DIR" or a URL), or a client.
    PoolRef = Union[str, PoolClient]

    class PoolKwargs(TypedDict):
        """What `pool_kwargs` returns: the pool-choosing keywords of `connect_all` and `RunOptions`."""

        servers: Optional[List[str]]
        state_dir: Optional[Path]
        devices_spec: Optional[str]
        token_file: Optional[Path]
        ca_file: Optional[Path]


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    """--server (repeatable), --state, --token-file, --ca and --devices."""
    group = parser.add_argument_group("pool selection")
    group.add_argument(
        "--server",
        action="append",
        metavar="URL",
        help="pool server (repeatable; http://, https:// or embedded:DIR). "
        "Default: --state's embedded pool, then $GPUPOOL_SERVER, then ~/.gpupool/client.yaml, then the embedded pool",
    )
    group.add_argument(
        "--state",
        metavar="DIR",
        help="state dir of the embedded pool; given alone it chooses that pool over $GPUPOOL_SERVER and "
        "client.yaml (default: $GPUPOOL_STATE or ~/.local/state/gpupool)",
    )
    group.add_argument(
        "--token-file",
        metavar="FILE",
        help="send the token in FILE (an admin's: the server's --token-file) instead of $GPUPOOL_TOKEN or the bundle's",
    )
    group.add_argument(
        "--ca",
        metavar="FILE",
        help="trust this CA certificate for https:// servers (the server's STATE/tls/ca.crt) instead of $GPUPOOL_CA, "
        "the bundle's or the system's",
    )
    group.add_argument(
        "--devices",
        metavar="SPEC",
        help="devices of the embedded pool, e.g. emulated:2x16GiB (default: $GPUPOOL_DEVICES, else NVML)",
    )


def pool_kwargs(args: argparse.Namespace) -> PoolKwargs:
    """Keyword arguments of `client.resolve.connect_all` from the parsed flags."""
    servers: Optional[List[str]] = args.server or None
    return {
        "servers": servers,
        "state_dir": Path(args.state).expanduser() if args.state else None,
        "devices_spec": args.devices,
        "token_file": Path(args.token_file).expanduser() if args.token_file else None,
        "ca_file": Path(args.ca).expanduser() if args.ca else None,
    }


def print_pool(where: Union[PoolRef, Iterable[PoolRef]], file: Optional[IO[str]] = None) -> None:
    """Print the line naming the pool(s) read (`pool: embedded /dir`, `pool: https://host:port`,
    `pools: a, b`): the first line of every client verb's human output, on the stream that output
    goes to (`file`, default stdout). Machine output (--json, --csv) does not call it.

    `where`: a client, an address, or several of either (e.g. the list `connect_all` returns)."""
    import sys

    from ..workload.client.resolve import pool_line

    refs = [where] if isinstance(where, str) or hasattr(where, "address") else list(where)
    addresses = [r if isinstance(r, str) else r.address for r in refs]
    print(pool_line(addresses), file=file if file is not None else sys.stdout)


def connect_one(args: argparse.Namespace, verb: str) -> PoolClient:
    """The one pool the flags choose, for verbs that change or report one pool (queues, usage of one
    pool's history): InvalidInput when they name several."""
    from ..core.errors import InvalidInput
    from ..workload.client.resolve import connect_all

    clients = connect_all(**pool_kwargs(args))
    if len(clients) > 1:
        addresses = ", ".join(c.address for c in clients)
        for c in clients:
            c.close()
        raise InvalidInput(
            f"{verb} acts on one pool, and {len(clients)} are configured ({addresses}): pick one with --server URL"
        )
    return clients[0]
