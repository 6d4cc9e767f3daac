"""`gpupool config show`: which pool a client verb would use, with which token and CA, and where
each of them comes from (flags, then env, then the config file)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from .groups import help_when_bare
from .pool_options import add_pool_arguments, pool_kwargs

if TYPE_CHECKING:
    from typing import List


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("config", help="the pool, token and CA a client uses, and where each comes from")
    sub = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    show = sub.add_parser(
        "show",
        help="the pool(s) the other verbs would use with these flags, and where each part comes from",
        description="Resolve the pool as every client verb does (--server / --state, then $GPUPOOL_SERVER, then "
        "~/.gpupool/client.yaml, then the embedded pool) and print it without connecting; the token's source "
        "is shown, never the token.",
    )
    show.add_argument("--json", action="store_true", help='one JSON object {"pools": [...]}')
    add_pool_arguments(show)
    show.set_defaults(func=handle_show)

    help_when_bare(p)


def handle_show(args: argparse.Namespace) -> int:
    from ..workload.client.resolve import EMBEDDED, choose_pools, pool_line

    kwargs = pool_kwargs(args)
    choices = [
        c.to_dict()
        for c in choose_pools(kwargs["servers"], kwargs["state_dir"], kwargs["token_file"], kwargs["ca_file"])
    ]
    if args.json:
        print(json.dumps({"pools": choices}))
        return 0
    lines: List[str] = []
    for c in choices:
        lines.append(f"{pool_line([c['pool']])}  (from {c['from']})")  # as the other verbs name it
        if not c["pool"].startswith(EMBEDDED):
            lines.append(f"  token: from {c['token_from']}")
            lines.append(f"  ca: {c['ca'] or 'system CAs'}" + (f"  (from {c['ca_from']})" if c["ca"] else ""))
    print("\n".join(lines))
    return 0
