"""Run the API: state-dir lock, devices, auth rules, TLS, the listening socket (served by `listener`).

`serve(config)` is what `gpupool server` runs; the kube node agent calls
`prepare(config)` to get the app and pool, adds its own parts, then `run(prepared)`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence, Tuple

from ...core.errors import InvalidInput, StateUnusable
from ...core.isolation_mode import IsolationMode, NodeIsolation
from ...core.model import DEFAULT_PREEMPT_GRACE_S, MAX_IDLE_SUSPEND_S, MAX_PREEMPT_GRACE_S, MIN_IDLE_SUSPEND_S, Device
from ...core.quantity import parse_duration
from ...core.suspension import DEFAULT_PREEMPT_MODE
from ...core.usage import EnforceMode
from ...pooling.pool import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S, Pool
from ...pooling.store import StateLock
from ..enforcement.watchdog import DEFAULT_GRACE_S, DEFAULT_INTERVAL_S, WatchdogConfig
from .auth import Authenticator, legacy_tokens, load_or_create_token_file
from .listener import DEFAULT_PORT, Limits, is_loopback, parse_listen, run_forever, tls_context
from .listener import bind as _bind

if TYPE_CHECKING:  # the app (FastAPI) is imported only when a server is prepared
    from .dashboard.routes import JobsReader

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_PORT", "is_loopback", "parse_listen"]  # the listen rules, kept importable from here


@dataclass
class NodeEnforcement:
    """The node's isolation mode and watchdog settings (flags of `gpupool server` and the node agent)."""

    isolation: str = IsolationMode.HOOKS.value
    enforce: str = EnforceMode.KILL.value  # over-share leases
    enforce_unleased: str = EnforceMode.WARN.value  # processes on pooled GPUs without a lease
    enforce_grace_s: float = DEFAULT_GRACE_S
    usage_interval_s: float = DEFAULT_INTERVAL_S
    idle_suspend: str = ""  # a duration; '' = leases without an idle limit of their own are never idle-suspended

    def parse(self) -> Tuple[IsolationMode, WatchdogConfig]:
        """Checked modes and settings; InvalidInput names the flag."""
        idle_s = None
        if self.idle_suspend:
            idle_s = parse_duration(self.idle_suspend, "--idle-suspend", MIN_IDLE_SUSPEND_S, MAX_IDLE_SUSPEND_S)
        watch = WatchdogConfig(
            interval_s=self.usage_interval_s,
            over_share=EnforceMode.parse(self.enforce, "--enforce"),
            unleased=EnforceMode.parse(self.enforce_unleased, "--enforce-unleased"),
            grace_s=self.enforce_grace_s,
            idle_suspend_s=idle_s,
        )
        return IsolationMode.parse(self.isolation), watch


@dataclass
class ServerConfig:
    """Everything `gpupool server` takes from its flags."""

    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    state_dir: str = "/var/lib/gpupool"
    token_file: Optional[str] = None
    devices: Optional[str] = None  # --devices: a spec for devices.discover that replaces the saved devices
    devices_env: Optional[str] = None  # $GPUPOOL_DEVICES: the same, but it may not replace other saved devices
    device_list: Optional[Sequence[Device]] = None  # given devices win over the spec
    node: str = ""
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_auto: bool = False
    tls_names: List[str] = field(default_factory=list)
    ttl_s: float = DEFAULT_TTL_S
    # Seconds a preempted lease's runner waits between SIGTERM and SIGKILL (a claim may name its own).
    preempt_grace_s: float = DEFAULT_PREEMPT_GRACE_S
    # What preempting a borrowing lease does in a queue that does not say (core.suspension.PREEMPT_MODES).
    preempt_mode: str = DEFAULT_PREEMPT_MODE
    expire_interval_s: float = 1.0
    log_level: str = "warning"
    enforcement: NodeEnforcement = field(default_factory=lambda: NodeEnforcement())
    # The hot lease calls answered before FastAPI's routing (see server/fastpath.py, the one seam).
    fast_path: bool = field(default_factory=lambda: _fast_path_default())
    # The dashboard's jobs: `gpupool server` passes jobs.executors.local.dashboard.reader(state_dir); None shows none.
    jobs: Optional[JobsReader] = None
    # Host names a loopback server without auth answers besides its own and the local ones (a proxy's).
    allow_hosts: List[str] = field(default_factory=list)


@dataclass
class Prepared:
    """A server ready to run: its app, pool, lock, bound socket and TLS files."""

    app: Any
    pool: Pool
    lock: StateLock
    sock: socket.socket
    url: str
    ssl_certfile: Optional[str]
    ssl_keyfile: Optional[str]
    auth: bool
    config: ServerConfig
    isolation: IsolationMode = IsolationMode.HOOKS
    watch: WatchdogConfig = field(default_factory=WatchdogConfig)

    def close(self) -> None:
        """Close the socket and the pool, then release the state dir (idempotent)."""
        self.sock.close()  # the listener serves a duplicate of it; this one is ours to close
        self.pool.close()
        self.lock.release()

    @contextlib.contextmanager
    def node_services(self) -> Iterator[None]:
        """The MPS daemon (in mps mode) and the usage watchdog, for as long as the server serves."""
        mps = None
        watchdog = None
        try:
            if self.isolation is IsolationMode.MPS:
                from ...pooling.isolation.mps import MpsDaemon

                mps = MpsDaemon(self.pool.state_dir)
                self.pool.set_isolation(mps.start())
            else:
                self.pool.set_isolation(NodeIsolation(self.isolation))
            from ..enforcement import Watchdog
            from ..enforcement.attest_listener import attestation_service

            # Attribution trusts only the runners that proved their lease on the node's socket; the
            # MPS daemon's descendants (its MPS servers) are the node's own, never unleased.
            with attestation_service(self.pool, mps.identity if mps is not None else lambda: None) as attributor:
                watchdog = Watchdog(self.pool, self.watch, attributor=attributor).start()
                yield
        finally:
            if watchdog is not None:
                watchdog.stop()
            if mps is not None:
                mps.stop()


def prepare(config: ServerConfig) -> Prepared:
    """Lock the state dir, open the pool, set up auth and TLS, and bind the socket."""
    host, port = parse_listen(config.listen)
    if not is_loopback(host) and not config.token_file:
        raise InvalidInput(
            f"listening on {host} (not loopback) needs authentication: add --token-file /etc/gpupool/token "
            "(created with a new admin token if absent), or listen on 127.0.0.1"
        )
    if bool(config.tls_cert) != bool(config.tls_key):
        raise InvalidInput("give both --tls-cert and --tls-key, or --tls auto")
    if config.tls_auto and config.tls_cert:
        raise InvalidInput("--tls auto and --tls-cert/--tls-key exclude each other: pick one")
    if not MIN_TTL_S <= config.ttl_s <= MAX_TTL_S:  # else every claim without its own ttl_s is refused
        raise InvalidInput(f"--ttl {config.ttl_s:g} must be between {MIN_TTL_S:g} and {MAX_TTL_S:g} seconds")
    if not (math.isfinite(config.preempt_grace_s) and 0 <= config.preempt_grace_s <= MAX_PREEMPT_GRACE_S):
        raise InvalidInput(
            f"--preempt-grace {config.preempt_grace_s:g} must be between 0 and {MAX_PREEMPT_GRACE_S:g} seconds"
        )
    isolation, watch = config.enforcement.parse()
    state = Path(config.state_dir).expanduser()
    lock = StateLock(state).acquire()
    pool: Optional[Pool] = None
    try:
        devices = config.device_list
        spec = config.devices if config.devices is not None else config.devices_env
        if devices is None and spec is not None:
            from ...pooling.devices import discover

            devices = discover(spec, config.node or None)
        pool = Pool(
            state,
            devices=devices,
            devices_from_env=config.device_list is None and config.devices is None and spec is not None,
            node=config.node,
            background_checkpoint=True,
            preempt_grace_s=config.preempt_grace_s,
            preempt_mode=config.preempt_mode,
            serving=True,  # renews what was live when the last server stopped (pool/renewal.py)
        )
        _doctor(state)
        admin_token = load_or_create_token_file(config.token_file) if config.token_file else None
        authenticator = Authenticator(admin_token, pool.store) if admin_token else None
        if authenticator is not None:
            legacy = legacy_tokens(pool.store)
            if legacy:
                log.warning(
                    "%d token(s) without a recorded origin are not honoured (a server without auth may have "
                    "made them): %s; create new ones with `gpupool token create`",
                    len(legacy),
                    ", ".join(legacy[:20]),
                )
        certfile, keyfile = config.tls_cert, config.tls_key
        if config.tls_auto:
            from .tls import ensure_self_signed

            _, cert_path, key_path = ensure_self_signed(state, [host, *config.tls_names])
            certfile, keyfile = str(cert_path), str(key_path)
        from .app import create_app

        app = create_app(
            pool,
            authenticator,
            default_ttl_s=config.ttl_s,
            expire_interval_s=config.expire_interval_s,
            jobs=config.jobs,
        )
        sock = _bind(host, port)
    except BaseException:
        # The pool's connections and checkpoint thread must not outlive a failed start
        # (the node agent, or a test, goes on living after it).
        if pool is not None:
            pool.close()
        lock.release()
        raise
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"{'https' if certfile else 'http'}://{shown}:{bound_port}"
    return Prepared(app, pool, lock, sock, url, certfile, keyfile, authenticator is not None, config, isolation, watch)


def _doctor(state: Path) -> None:
    """`gpupool doctor` at start: a damaged database stops the server, other problems are logged."""
    from ...pooling.pool.doctor import check_state
    from ...pooling.store.db import damaged_message

    report = check_state(state)
    if report.damaged:
        raise StateUnusable(damaged_message(Path(report.db), "; ".join(p.message for p in report.problems[:3])))
    for line in report.lines():
        log.warning("doctor: %s", line)


def run(prepared: Prepared) -> None:
    """Serve until SIGINT/SIGTERM, then close the pool and release the lock.

    Releases the socket, pool and lock on every exit path, a failed start included.
    """
    try:
        limits = Limits()
        app = _app(prepared, limits)
        certfile, keyfile = prepared.ssl_certfile, prepared.ssl_keyfile
        tls = tls_context(certfile, keyfile) if certfile and keyfile else None
        devices = prepared.pool.devices()
        with prepared.node_services():  # an MPS daemon that cannot start fails here, before "listening"
            print(
                f"gpupool server listening on {prepared.url} (state {prepared.pool.state_dir}, "
                f"{len(devices)} GPU(s), auth {'on' if prepared.auth else 'off: loopback only'}, "
                f"isolation {prepared.isolation.value})",
                file=sys.stderr,
                flush=True,
            )
            received = run_forever(app, prepared.sock, limits, tls)
        log.info("server stopped (signal %s)", received or "none")
    finally:
        prepared.close()


def _app(prepared: Prepared, limits: Limits) -> Any:
    """The app as served: the fast path, the local-only rules (loopback without auth), the bounds."""
    from .bounds import Bounded

    app = prepared.app
    if prepared.config.fast_path:
        from .fastpath import FastPath

        app = FastPath(app, app.state.api)
    if not prepared.auth:  # prepare() allows no auth on loopback only
        from .app import serves
        from .localonly import LocalOnly, allowed_names

        names = allowed_names(parse_listen(prepared.config.listen)[0], prepared.config.allow_hosts)
        app = LocalOnly(app, names, serves(prepared.app))
    return Bounded(app, limits)


def _fast_path_default() -> bool:
    from .fastpath import enabled_by_env  # light: fastpath imports no web framework

    return enabled_by_env()


def serve(config: ServerConfig) -> None:
    """prepare + run: the whole `gpupool server`."""
    run(prepare(config))
