"""`gpupool token create | list | revoke | rotate`: named tokens, and client bundles (client.yaml,
servers.conf, ca.crt) as a tar."""

from __future__ import annotations

import argparse
import getpass
import io
import json
import os
import ssl
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..core.errors import GpupoolError, InvalidInput, Unauthorized
from ..core.operations import CREATE_TOKEN, LIST_TOKENS, REVOKE_TOKEN, ROTATE_TOKEN, Operation
from .groups import help_when_bare
from .pool_options import print_pool


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("token", help="create client tokens and bundles")
    sub = p.add_subparsers(dest="token_command", metavar="SUBCOMMAND")
    c = sub.add_parser(
        "create",
        help="create a named token and write a client bundle tar",
        description="Create a token named NAME (through the server with the admin token, or directly in "
        "--state) and write a tar with client.yaml, servers.conf and, with TLS, ca.crt.",
    )
    c.add_argument("--server", action="append", required=True, metavar="URL", help="server URL (repeatable)")
    c.add_argument("--name", default=None, help="token name = lease holder name (default: your user name)")
    c.add_argument("--admin", action="store_true", help="an admin token (may release any lease, create tokens)")
    c.add_argument(
        "--queue",
        default="",
        metavar="QUEUE",
        help="bind the token to this queue (gpupool queue set): its claims go there, and into no other",
    )
    c.add_argument(
        "--admin-token-file", default="/etc/gpupool/token", metavar="FILE", help="admin token to ask the server with"
    )
    c.add_argument("--state", metavar="DIR", help="create the token directly in this state dir (no server call)")
    c.add_argument("--ca", metavar="PEM", help="CA certificate to bundle (default: STATE/tls/ca.crt when present)")
    c.add_argument("--out", required=True, metavar="TAR", help="bundle to write (e.g. bundle.tar)")
    c.add_argument("--replace", action="store_true", help="replace a token of that name (its old token stops working)")
    c.set_defaults(func=handle_create)

    for verb, text in (
        ("list", "the named tokens: name, admin, queue, origin, created, last used"),
        ("revoke", "delete a named token: it stops working"),
        ("rotate", "a new token for a name, as it was (admin, queue), and its bundle; the old one stops working"),
    ):
        v = sub.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        if verb != "list":
            v.add_argument("name", metavar="NAME")
        v.add_argument("--server", metavar="URL", help="ask this server, with the admin token")
        v.add_argument("--state", metavar="DIR", help="work directly in this state dir (no server call)")
        v.add_argument(
            "--admin-token-file",
            default="/etc/gpupool/token",
            metavar="FILE",
            help="admin token to ask the server with",
        )
        v.add_argument(
            "--ca",
            metavar="PEM",
            help="the server's CA certificate, to verify it"
            + (" and to bundle" if verb == "rotate" else "")
            + " (default: STATE/tls/ca.crt when present)",
        )
        if verb == "list":
            v.add_argument("--json", action="store_true", help='one JSON object {"tokens": [...]}')
        if verb == "rotate":
            v.add_argument("--out", required=True, metavar="TAR", help="bundle to write with the new token")
        v.set_defaults(func={"list": handle_list, "revoke": handle_revoke, "rotate": handle_rotate}[verb])

    help_when_bare(p)


def handle_create(args: argparse.Namespace) -> int:
    from ..workload.client.config import client_bundle, normalize_url

    urls = [normalize_url(u) for u in args.server]
    name = args.name or getpass.getuser()
    ca_file = _ca_file(args.ca, args.state)
    ca_pem = _ca_pem(ca_file, bool(args.ca))
    if args.state:
        token = _create_local(Path(args.state).expanduser(), name, args.admin, args.queue, args.replace)
    else:
        admin_token = _admin_token(args.admin_token_file)
        token = _create_remote(urls[0], name, args.admin, admin_token, ca_file, args.queue, args.replace)
    if any(u.startswith("https://") for u in urls) and not ca_pem:
        print(
            "gpupool: warning: no CA to bundle (--ca or --state); clients will trust system CAs only", file=sys.stderr
        )
    files = client_bundle(urls, token, ca_pem)
    _write_tar(Path(args.out), files)
    print_pool(_pool(args.state, urls[0]), sys.stderr)
    bound = f" (queue {args.queue!r})" if args.queue else ""
    print(f"token {name!r}{bound} written to {args.out} ({', '.join(sorted(files))})", file=sys.stderr)
    print(f"install: mkdir -p ~/.gpupool && tar -xf {args.out} -C ~/.gpupool", file=sys.stderr)
    return 0


def handle_list(args: argparse.Namespace) -> int:
    rows = _on_tokens(args, LIST_TOKENS, lambda store: [t.to_dict() for t in _auth().list_tokens(store)])
    tokens = rows if isinstance(rows, list) else rows.get("tokens", [])
    if args.json:
        print(json.dumps({"tokens": tokens}))
        return 0
    print_pool(_pool(args.state, args.server))
    table = [["NAME", "ADMIN", "QUEUE", "ORIGIN", "CREATED", "LAST USED"]]
    for t in tokens:
        table.append(
            [
                t["name"],
                "yes" if t["admin"] else "-",
                t["queue"] or "-",
                t["origin"],
                _when(t["created_at"]),
                _when(t["last_used"]) if t["last_used"] is not None else "never",
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def handle_revoke(args: argparse.Namespace) -> int:
    _on_tokens(args, REVOKE_TOKEN, lambda store: _auth().revoke_token(store, args.name), name=args.name)
    print_pool(_pool(args.state, args.server), sys.stderr)
    print(f"gpupool: token {args.name!r} revoked: it no longer authenticates", file=sys.stderr)
    return 0


def handle_rotate(args: argparse.Namespace) -> int:
    from ..workload.client.config import client_bundle

    if not args.server:
        raise InvalidInput("gpupool token rotate needs --server URL: the bundle names the server its clients use")

    def local(store: Any) -> Dict[str, str]:
        return {"token": _auth().rotate_token(store, args.name)}

    answer = _on_tokens(args, ROTATE_TOKEN, local, name=args.name)
    token = answer.get("token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token:
        raise GpupoolError(f"{args.server} answered without a token: is it a gpupool server?")
    ca_file = _ca_file(args.ca, args.state)
    _write_tar(Path(args.out), client_bundle([args.server], token, _ca_pem(ca_file, bool(args.ca))))
    print_pool(_pool(args.state, args.server), sys.stderr)
    print(f"token {args.name!r} rotated: the new one is in {args.out}; the old one no longer works", file=sys.stderr)
    return 0


def _pool(state: Optional[str], server: Optional[str]) -> str:
    """The pool a token verb acts on: --state's (no server call), else --server's."""
    from ..workload.client.config import normalize_url

    return f"embedded:{Path(state).expanduser()}" if state else normalize_url(str(server))


def _auth() -> Any:
    from ..serving.server import auth  # the token rules; only the --state forms need the server's modules

    return auth


def _on_tokens(args: argparse.Namespace, op: Operation[Any], local: Any, **call: Any) -> Any:
    """`local(store)` in --state's store, else the admin call `op` (with `call`) on --server."""
    if args.state:
        from ..pooling.store import Store

        store = Store(Path(args.state).expanduser())
        try:
            return local(store)
        finally:
            store.close()
    if not args.server:
        raise InvalidInput(
            f"give --server URL (with --admin-token-file) or --state DIR for `gpupool token {op.name.split('_')[0]}`"
        )
    from ..workload.client.config import normalize_url
    from ..workload.client.http import HttpPoolClient

    url = normalize_url(args.server)
    client = HttpPoolClient(url, _admin_token(args.admin_token_file), str(_ca_file(args.ca, None) or ""))
    try:
        return client.call(op, **call)
    except Unauthorized:
        raise Unauthorized(f"{url} refused the admin token: pass --admin-token-file, or --state on its host") from None
    finally:
        client.close()


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def _create_local(state: Path, name: str, admin: bool, queue: str, replace: bool = False) -> str:
    """The token made in the state dir; the pool is opened only to check a queue to bind it to."""
    from ..pooling.store import Store
    from ..serving.server.auth import create_token, require_queue

    if queue:
        from ..pooling.pool import Pool

        pool = Pool(state)
        try:
            require_queue(pool, queue)
        finally:
            pool.close()
    store = Store(state)
    try:
        return create_token(store, name, admin, queue=queue, replace=replace)
    finally:
        store.close()


def _ca_file(ca: Optional[str], state: Optional[str]) -> Optional[Path]:
    """The CA certificate to bundle and to verify the server with: --ca, else STATE/tls/ca.crt when present."""
    if ca:
        path = Path(ca).expanduser()
        if not path.is_file():
            raise InvalidInput(f"--ca {ca}: no such file; give the server's CA certificate (STATE/tls/ca.crt)")
        return path
    if state:
        from ..serving.server.tls import ca_path

        path = ca_path(Path(state).expanduser())
        if path.is_file():
            return path
    return None


def _ca_pem(ca_file: Optional[Path], flag: bool) -> Optional[str]:
    """The PEM text of `ca_file`; a file given with --ca (`flag`) must hold a certificate."""
    if ca_file is None:
        return None
    pem = ca_file.read_text(encoding="utf-8", errors="replace")
    if flag:
        try:
            ssl.create_default_context(cadata=pem)
        except ssl.SSLError:
            raise InvalidInput(
                f"--ca {ca_file} is not a PEM certificate; give the server's CA (STATE/tls/ca.crt)"
            ) from None
    return pem


def _admin_token(path: str) -> str:
    from ..workload.client.resolve import read_token_file

    return read_token_file(Path(path).expanduser(), "--admin-token-file")


def _create_remote(
    url: str, name: str, admin: bool, admin_token: str, ca_file: Optional[Path], queue: str = "", replace: bool = False
) -> str:
    """The token made by the server at `url` (POST /v1/tokens with the admin token), through the pool's client."""
    from ..workload.client.http import HttpPoolClient

    client = HttpPoolClient(url, admin_token, str(ca_file or ""))
    try:
        answer = client.call(CREATE_TOKEN, name=name, admin=admin, queue=queue, replace=replace)
    except Unauthorized:
        raise Unauthorized(
            f"{url} refused the admin token: pass --admin-token-file with the file the server's --token-file "
            "wrote, or --state on the server's host"
        ) from None
    finally:
        client.close()
    token = answer.get("token")
    if not isinstance(token, str) or not token:
        raise GpupoolError(f"{url} answered POST /v1/tokens without a token: is it a gpupool server?")
    return token


def _write_tar(out: Path, files: Dict[str, str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(out), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds a token
    with os.fdopen(fd, "wb") as handle, tarfile.open(fileobj=handle, mode="w") as tar:
        for name, content in sorted(files.items()):
            data = content.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))


__all__: List[str] = ["register", "handle_create", "handle_list", "handle_revoke", "handle_rotate"]
