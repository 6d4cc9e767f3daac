"""Choose the pool(s) to talk to, and for several servers the one that takes a claim.

Order: `--server URL` flags > `GPUPOOL_SERVER` (comma separated) > client
config (client.yaml + servers.conf) > the embedded pool on the state dir.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ...core.errors import (
    NO_ROOM_ADVICE,
    GpupoolError,
    InvalidClaim,
    InvalidInput,
    ServerUnreachable,
    Unavailable,
    Unsatisfiable,
)
from ...core.isolation_mode import IsolationMode
from ...core.model import Claim, Device, Holder, Lease
from ...core.outage import RETRY_MAX_S, backoff, new_key
from ...core.status import PoolStatus
from ...logs import get_logger
from ...pooling.isolation.env import DEVICES_ENV
from .base import PoolClient
from .config import SCHEMES, TOKEN_ENV, ClientConfig, load_client_config, normalize_url

if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

    from ...core.queues import QueueStatus
    from ...core.usage import UsageReport

    Progress = Callable[[str], None]
    # Started when a claim queues (with its client and key), stopped when the wait ends: what a
    # waiting `gpupool run` shows of its place (runner/waitline.py).
    WaitView = Callable[[PoolClient, str], Any]

log = get_logger(__name__)

SERVER_ENV = "GPUPOOL_SERVER"
CA_ENV = "GPUPOOL_CA"
EMBEDDED = "embedded:"


def server_addresses(servers: Optional[Sequence[str]] = None, config: Optional[ClientConfig] = None) -> List[str]:
    """The pool addresses to use, by precedence; [] means the embedded pool."""
    if servers:
        return [_check_address(s) for s in servers]
    env = os.environ.get(SERVER_ENV, "").strip()
    if env:
        return [_check_address(s) for s in env.split(",") if s.strip()]
    config = config if config is not None else load_client_config()
    return [entry.url for entry in config.servers]


def pool_line(addresses: Sequence[str]) -> str:
    """The line that names the pool(s) a verb reads, first in its human output: `pool: embedded
    /abs/state-dir`, `pool: https://host:port`, or for several `pools: a, b`."""
    names = [
        f"embedded {os.path.abspath(a[len(EMBEDDED) :])}" if a.lower().startswith(EMBEDDED) else a for a in addresses
    ]
    return ("pool: " if len(names) == 1 else "pools: ") + ", ".join(names)


def _check_address(text: str) -> str:
    text = str(text).strip()
    if text.lower().startswith(EMBEDDED):
        return text
    if not text.lower().startswith(SCHEMES):
        raise InvalidInput(
            f"--server {text!r} has an unknown scheme: use http://HOST:PORT, https://HOST:PORT "
            "or embedded:/path/to/state-dir"
        )
    return normalize_url(text)


class PoolChoice(NamedTuple):
    """One pool the flags, env and config choose, and where each part of it came from."""

    address: str  # a URL, or "embedded:<state dir>"
    source: str  # "--state", "--server", "$GPUPOOL_SERVER", the config file's path, or "default"
    token: str = ""  # never shown (not in repr either): `config show` gives its source only
    token_source: str = "none"
    ca: str = ""
    ca_source: str = ""

    def __repr__(self) -> str:  # all but the token
        return (
            f"PoolChoice(address={self.address!r}, source={self.source!r}, token_source={self.token_source!r}, "
            f"ca={self.ca!r}, ca_source={self.ca_source!r})"
        )

    def to_dict(self) -> Dict[str, str]:
        return {
            "pool": self.address,
            "from": self.source,
            "token_from": self.token_source,
            "ca": self.ca,
            "ca_from": self.ca_source,
        }


def choose_pools(
    servers: Optional[Sequence[str]] = None,
    state_dir: Optional[Path] = None,
    token_file: Optional[Path] = None,
    ca_file: Optional[Path] = None,
) -> List[PoolChoice]:
    """The pools to use, by the one rule: flags (--server, --state), then env, then the config file,
    then the embedded pool of $GPUPOOL_STATE or its default. A server's token likewise: --token-file,
    then $GPUPOOL_TOKEN, then the config entry's; its CA: --ca, then the config entry's, then $GPUPOOL_CA."""
    if state_dir is not None and not servers:
        # An explicit --state names the pool: it beats $GPUPOOL_SERVER and client.yaml, which it
        # silently lost to once a bundle was installed.
        return [PoolChoice(f"{EMBEDDED}{state_dir}", "--state")]
    env = os.environ.get(SERVER_ENV, "").strip()
    config: Optional[ClientConfig] = None
    if not servers and not env:
        config = load_client_config()
    addresses = server_addresses(servers, config)
    if not addresses:
        from .embedded import STATE_ENV, default_state_dir  # only here: a run against a server never loads it

        source = f"${STATE_ENV}" if os.environ.get(STATE_ENV) else "default"
        return [PoolChoice(f"{EMBEDDED}{default_state_dir()}", source)]
    source = "--server" if servers else (f"${SERVER_ENV}" if env else (config.path if config else ""))
    if config is None:
        try:
            config = load_client_config()
        except InvalidInput as err:  # a broken config must not block an explicit --server
            log.warning("ignoring client config: %s", err.message)
            config = ClientConfig()
    choices: List[PoolChoice] = []
    for address in addresses:
        if address.lower().startswith(EMBEDDED):
            from .embedded import default_state_dir

            path = address[len(EMBEDDED) :]
            where = Path(path) if path else (state_dir or default_state_dir())
            choices.append(PoolChoice(f"{EMBEDDED}{where}", source))
            continue
        entry = config.entry_for(address)
        if token_file is not None:
            token, token_source = read_token_file(token_file), "--token-file"
        else:
            token, token_source = os.environ.get(TOKEN_ENV, ""), f"${TOKEN_ENV}"
        if not token:
            token, token_source = (entry.token, config.path) if entry and entry.token else ("", "none")
        ca, ca_source = (entry.ca, config.path) if entry and entry.ca else (os.environ.get(CA_ENV, ""), f"${CA_ENV}")
        if ca_file is not None:
            if not ca_file.is_file():
                raise InvalidInput(f"--ca {ca_file}: no such file; give the server's CA certificate (STATE/tls/ca.crt)")
            ca, ca_source = str(ca_file), "--ca"
        choices.append(PoolChoice(address, source, token, token_source, ca, ca_source if ca else "system CAs"))
    return choices


def read_token_file(path: Path, flag: str = "--token-file") -> str:
    """The token in `path`, given with `flag`; InvalidInput naming the flag and file when it cannot be used."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise InvalidInput(f"{flag} {path}: {reason}; give the file that holds the token") from None
    if not token or "\n" in token:
        raise InvalidInput(f"{flag} {path} must hold one token on one line")
    return token


def connect_all(
    servers: Optional[Sequence[str]] = None,
    state_dir: Optional[Path] = None,
    devices_spec: Optional[str] = None,
    isolation: Optional[IsolationMode] = None,
    token_file: Optional[Path] = None,
    ca_file: Optional[Path] = None,
) -> List[PoolClient]:
    """One client per pool to use (at least one: the embedded pool when no server is named), as
    `choose_pools` chooses them. `isolation` sets the embedded pool's mode; a server's mode is its
    own (`gpupool server --isolation`)."""
    choices = choose_pools(servers, state_dir, token_file, ca_file)
    embedded = [c.address.lower().startswith(EMBEDDED) for c in choices]
    if isolation is not None and not all(embedded):
        raise InvalidInput(
            f"--isolation {isolation.value} applies to the embedded pool only: a server keeps the mode it was "
            "started with (gpupool server --isolation); drop the flag or the --server"
        )
    clients: List[PoolClient] = []
    for choice, local in zip(choices, embedded):
        if local:
            clients.append(_embedded(Path(choice.address[len(EMBEDDED) :]), devices_spec, isolation))
            continue
        from .http import HttpPoolClient

        clients.append(HttpPoolClient(choice.address, token=choice.token, ca=choice.ca))
    return clients


def connect(
    servers: Optional[Sequence[str]] = None,
    state_dir: Optional[Path] = None,
    devices_spec: Optional[str] = None,
) -> PoolClient:
    """The first pool of `connect_all` (for verbs that talk to one pool)."""
    clients = connect_all(servers, state_dir, devices_spec)
    for extra in clients[1:]:
        extra.close()
    return clients[0]


def _embedded(
    state_dir: Optional[Path], devices_spec: Optional[str], isolation: Optional[IsolationMode] = None
) -> PoolClient:
    from .embedded import EmbeddedPoolClient

    devices = None
    if devices_spec or os.environ.get(DEVICES_ENV):
        from ...pooling.devices import discover

        devices = discover(devices_spec)
    return EmbeddedPoolClient(state_dir, devices=devices, isolation=isolation, devices_from_env=not devices_spec)


def choose_and_claim(
    clients: Sequence[PoolClient],
    claim: Claim,
    holder: Holder,
    *,
    wait_s: float = 0.0,
    ttl_s: float = 30.0,
    progress: Progress = lambda line: None,
    waiting_view: Optional[WaitView] = None,
) -> Tuple[PoolClient, Lease]:
    """Claim on the first pool that can hold `claim` now, else wait on the first that ever could.

    `server.addr=` filters of the claim choose among `clients`; unreachable
    servers are skipped with a warning.
    """
    server_filters = [f for r in claim.requests for f in r.filters if f.is_server_filter]
    eligible = [c for c in clients if all(f.matches_server(c.address) for f in server_filters)]
    if not eligible:
        wanted = ", ".join(f.to_text() for f in server_filters)
        known = ", ".join(c.address for c in clients)
        raise InvalidClaim(f"no pool server matches {wanted}: the servers are {known}")
    if len(eligible) == 1:
        client = eligible[0]
        return client, _claim_one(client, claim, holder, wait_s, ttl_s, progress, waiting_view)

    # Placement (and fragaware's scoring under it) only to compare several pools: one pool places its own.
    from ...core.placement import could_ever_fit, place

    reachable: List[Tuple[PoolClient, PoolStatus]] = []
    for client in eligible:
        try:
            reachable.append((client, client.status()))
        except ServerUnreachable as err:
            progress(f"warning: skipping {client.address}: {err.message}")
    if not reachable:
        raise ServerUnreachable(
            "none of the pool servers answered (" + ", ".join(c.address for c in eligible) + "): "
            "check that they run and the URLs in --server / the client config"
        )
    for client, status in reachable:
        if place(status.devices, status.allocated(), claim).fits:
            try:
                return client, client.claim(claim, holder, wait_s=0.0, ttl_s=ttl_s)
            except Unavailable:  # someone else took it since the status; try the next
                continue
            except ServerUnreachable as err:
                progress(f"warning: skipping {client.address}: {err.message}")
    reasons = []
    for client, status in reachable:
        ever = could_ever_fit(status.devices, claim)
        if ever.fits:
            return client, _claim_one(client, claim, holder, wait_s, ttl_s, progress, waiting_view)
        reasons.append(f"{client.address}: {ever.reason}")
    raise Unsatisfiable("no pool server could ever hold this claim: " + "; ".join(reasons))


def _claim_one(
    client: PoolClient,
    claim: Claim,
    holder: Holder,
    wait_s: float,
    ttl_s: float,
    progress: Progress,
    waiting_view: Optional[WaitView] = None,
) -> Lease:
    """Try at once; when it does not fit and a wait is allowed, say so and queue.

    Every try of the claim carries one key, so a try after a lost answer gets the lease granted
    to it; a claim with a wait rides out an outage of the server until its wait runs out.
    """
    key = new_key()
    deadline = time.monotonic() + wait_s
    try:
        return client.claim(claim, holder, wait_s=0.0, ttl_s=ttl_s, key=key)
    except Unavailable as err:
        if wait_s <= 0:
            raise
        reason = err.message.replace(f"; {NO_ROOM_ADVICE}", "")  # it waits already: the advice does not fit
        progress(f"Waiting up to {wait_s:g}s in the queue of {client.address}: {reason}")
    except ServerUnreachable as err:
        if wait_s <= 0:
            raise
        _outlast(client, err, deadline, progress)
    view = waiting_view(client, key) if waiting_view is not None else None
    try:
        return claim_waiting(client, claim, holder, deadline, ttl_s, key, progress)
    finally:
        if view is not None:
            view.stop()


def claim_waiting(
    client: PoolClient, claim: Claim, holder: Holder, deadline: float, ttl_s: float, key: str, progress: Progress
) -> Lease:
    """Wait in `client`'s queue until time.monotonic() `deadline`, riding out outages of its server:
    each try carries `key` (core.outage.new_key, one per claim), so it finds its place again."""
    while True:
        try:
            return client.claim(claim, holder, wait_s=max(0.0, deadline - time.monotonic()), ttl_s=ttl_s, key=key)
        except ServerUnreachable as err:
            _outlast(client, err, deadline, progress)


def _outlast(client: PoolClient, err: ServerUnreachable, deadline: float, progress: Progress) -> None:
    """Wait (with backoff) until `client`'s server answers again, saying so once when it goes and
    once when it is back; re-raise `err` when `deadline` comes first."""
    progress(f"warning: {err.message}; trying again until the claim's wait runs out (a place in the queue is kept)")
    for pause in backoff(RETRY_MAX_S):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise err
        time.sleep(min(pause, remaining))
        try:
            client.status()
        except ServerUnreachable:
            continue
        except GpupoolError:  # it answered, if only with an error: the claim says the rest
            pass
        progress(f"the pool server at {client.address} answers again: the claim goes on")
        return


def merged_status(clients: Sequence[PoolClient], progress: Progress = lambda line: None) -> PoolStatus:
    """One PoolStatus over several pools (unreachable ones skipped with a warning)."""
    if len(clients) == 1:
        return clients[0].status()
    devices: List[Device] = []
    leases: List[Lease] = []
    nodes: List[str] = []
    queued = 0
    usages: List[UsageReport] = []
    queues: List[QueueStatus] = []  # each pool's own queues, side by side (quotas are per pool)
    errors: List[GpupoolError] = []
    for client in clients:
        try:
            status = client.status()
        except ServerUnreachable as err:
            progress(f"warning: skipping {client.address}: {err.message}")
            errors.append(err)
            continue
        devices.extend(status.devices)
        leases.extend(status.leases)
        queued += status.queued
        nodes.append(status.node)
        if status.usage is not None:
            usages.append(status.usage)
        queues.extend(status.queues)
    if len(errors) == len(clients):
        raise errors[0]
    usage = None
    if usages:
        from ...core.usage import UsageReport

        usage = UsageReport.merge(usages)
    return PoolStatus(
        tuple(devices), tuple(leases), queued, ",".join(n for n in nodes if n), usage=usage, queues=tuple(queues)
    )
