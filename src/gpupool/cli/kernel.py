"""`gpupool kernel install/list/remove`: Jupyter kernels that hold a GPU share only while they compute."""

from __future__ import annotations

import argparse
import dataclasses
import sys

EXAMPLES = """examples:
  gpupool kernel install gpu-quarter --fraction 0.25 --idle-suspend 10m
  gpupool kernel install --fraction 0.5 --idle-suspend 30m      # named gpu-0.5-idle-30m
  sudo gpupool kernel install --system --fraction 0.25            # for every user (a JupyterHub)
  gpupool kernel install big --memory 40GiB --queue team-a --server https://pool:7070
  gpupool kernel list
  gpupool kernel remove gpu-quarter

The kernel starts as `gpupool run` does (a lease of the share, released when the kernel ends).
After --idle-suspend with no cell running its lease is suspended (its GPU memory parked in host
memory and given back to the pool); the next cell resumes it first, waiting for room if the
GPU was taken meanwhile.
"""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `kernel`."""
    p = subparsers.add_parser(
        "kernel",
        help="Jupyter kernels on a GPU share that is given back while they idle",
        description="Install, list and remove Jupyter kernelspecs that run a kernel under a gpupool lease.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    install = verbs.add_parser("install", help="write a kernelspec that wraps an installed kernel")
    install.add_argument(
        "name",
        nargs="?",
        default="",
        metavar="NAME",
        help="the new kernel's name (default from its settings, e.g. gpu-0.25-idle-10m)",
    )
    share = install.add_mutually_exclusive_group()
    share.add_argument("-p", "--fraction", metavar="F", help="share of one GPU's memory in (0, 1] (default 1)")
    share.add_argument("-m", "--memory", metavar="SIZE", help="GPU memory: MiB or a size such as 8GiB")
    install.add_argument("--queue", default="", metavar="NAME", help="the team queue to claim in")
    install.add_argument(
        "--idle-suspend",
        default="10m",
        metavar="DURATION",
        help="suspend the lease after this long with no cell running (default 10m; 'never' keeps it)",
    )
    install.add_argument("--server", default="", metavar="URL", help="pool server (default: as gpupool run finds it)")
    install.add_argument(
        "--display-name",
        default="",
        metavar="TEXT",
        help="the name frontends show (default: the wrapped kernel's, then share, idle limit, queue, server)",
    )
    install.add_argument("--kernel", default="python3", metavar="NAME", help="the kernel to wrap (default python3)")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--prefix", default=None, metavar="DIR", help="install under DIR/share/jupyter (e.g. a venv)")
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help="install in this Python environment's share/jupyter (as ipykernel's --sys-prefix)",
    )
    where.add_argument(
        "--system",
        action="store_true",
        help="install for every user of the machine (Jupyter's system folder, e.g. /usr/local/share/jupyter; root)",
    )
    install.set_defaults(func=handle_install)
    listing = verbs.add_parser("list", help="the gpupool kernelspecs installed")
    listing.set_defaults(func=handle_list)
    remove = verbs.add_parser("remove", help="remove a gpupool kernelspec")
    remove.add_argument("name", metavar="NAME")
    remove.set_defaults(func=handle_remove)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def handle_install(args: argparse.Namespace) -> int:
    from ..core.errors import InvalidInput
    from ..core.model import MAX_IDLE_SUSPEND_S, MIN_IDLE_SUSPEND_S, check_queue_name
    from ..core.quantity import parse_duration, parse_fraction, parse_memory_mib
    from ..serving.notebook.kernelspec import default_name, install
    from ..serving.notebook.launch import KernelSettings

    fraction = parse_fraction(args.fraction, what="--fraction") if args.fraction is not None else None
    memory = parse_memory_mib(args.memory, what="--memory") if args.memory is not None else None
    idle = None
    if args.idle_suspend.strip().lower() != "never":
        idle = parse_duration(args.idle_suspend, "--idle-suspend", MIN_IDLE_SUSPEND_S, MAX_IDLE_SUSPEND_S)
    server = args.server.strip()
    if server and not server.lower().startswith(("http://", "https://", "embedded:")):
        raise InvalidInput(f"--server {server!r} must be http://, https:// or embedded:DIR")
    settings = KernelSettings(
        name=args.name,
        fraction=fraction if memory is None else None,
        memory_mib=memory,
        queue=check_queue_name(args.queue, InvalidInput) if args.queue else "",
        idle_suspend_s=idle,
        server=server,
    )
    if not args.name:
        settings = dataclasses.replace(settings, name=default_name(settings, args.kernel))
    prefix = sys.prefix if args.sys_prefix else args.prefix
    folder = install(settings, wrapped=args.kernel, display_name=args.display_name, prefix=prefix, system=args.system)
    print(f"Installed kernel {settings.name.lower()} ({settings.describe()}) in {folder}")
    return 0


def handle_list(args: argparse.Namespace) -> int:
    from ..serving.notebook.kernelspec import installed

    rows = installed()
    if not rows:
        print("no gpupool kernels (gpupool kernel install NAME --fraction 0.25 adds one)")
        return 0
    for name, folder, settings, display in rows:
        print(f"{name}\t{display}\t{settings.describe()}\t{folder}")
    return 0


def handle_remove(args: argparse.Namespace) -> int:
    from ..serving.notebook.kernelspec import remove

    print(f"Removed {remove(args.name)}")
    return 0
