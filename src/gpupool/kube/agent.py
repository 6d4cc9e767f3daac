"""The node agent (DaemonSet): the node's pool server plus the device plugin.

The runner in a pod claims its GPU share from this agent, labelled with the
pod's UID, when the container starts. The agent also releases leases of pods
that no longer exist, and keeps the cluster's user tokens (a mounted Secret)
in its pool's token table, so one token works on every node.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Callable, List, Optional, Set, Tuple

from ..core.attestation import SOCKET_ENV
from ..core.model import Lease, pod_uid_of_label
from ..core.suspension import DEFAULT_PREEMPT_MODE
from ..pooling.pool import Pool
from ..pooling.store import Store
from ..serving.enforcement.attest import socket_path
from ..serving.server.serve import NodeEnforcement
from .apiserver import core_v1
from .dra import DEFAULT_DRIVER
from .dra.cdi import DEFAULT_CDI_DIR

if TYPE_CHECKING:
    from ..pooling.devices.health import HealthWatcher

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    kubelet_dir: str = "/var/lib/kubelet/device-plugins"
    devices: str = "auto"
    listen: str = "0.0.0.0:56001"
    state_dir: str = "/var/lib/gpupool"
    token_file: Optional[str] = "/etc/gpupool-agent/token"  # admin token (Secret gpupool-agent-token)
    tokens_dir: Optional[str] = "/etc/gpupool-tokens"  # user tokens: one file per name (Secret gpupool-tokens)
    node: str = ""  # default: env NODE_NAME, else the host name
    advertise: str = ""  # agent URL handed to containers; default http://$NODE_IP:port
    reap_interval_s: float = 30.0
    in_cluster: bool = True  # reap with the node's pod list from the API server
    live_pods_file: Optional[str] = None  # reap with the pod UIDs of this file instead (tests, development)
    enforcement: NodeEnforcement = field(default_factory=NodeEnforcement)  # isolation mode and watchdog
    preempt_mode: str = DEFAULT_PREEMPT_MODE  # what preempting a borrower does in queues that do not say
    # TLS: a serving certificate as files, or the agents' CA, from which the agent issues itself one
    # for its node's IP at start (deploy/: Secret gpupool-agent-ca). Plain HTTP only on loopback.
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_ca_cert: Optional[str] = None
    tls_ca_key: Optional[str] = None
    # DRA (resource.k8s.io/v1): a kubelet DRA plugin on the same pool, beside or instead of the device plugin.
    dra: bool = False
    dra_driver: str = DEFAULT_DRIVER
    cdi_dir: str = DEFAULT_CDI_DIR
    device_plugin: bool = True

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert or self.tls_ca_cert)

    def check(self) -> None:
        """Refuse flag combinations that cannot work, and bearer tokens in clear text off loopback."""
        from ..core.errors import InvalidInput
        from ..serving.server.serve import parse_listen

        for a, b, what in (
            (self.tls_cert, self.tls_key, "--tls-cert and --tls-key"),
            (self.tls_ca_cert, self.tls_ca_key, "--tls-ca-cert and --tls-ca-key"),
        ):
            if bool(a) != bool(b):
                raise InvalidInput(f"give both {what}, or neither")
        if self.tls_cert and self.tls_ca_cert:
            raise InvalidInput("give --tls-cert/--tls-key or --tls-ca-cert/--tls-ca-key, not both")
        host, _ = parse_listen(self.listen)
        if not self.dra and not self.device_plugin:
            raise InvalidInput("--no-device-plugin needs --dra: the agent must serve the kubelet one way")
        if self.dra:
            from .dra.plugin import DraConfig

            DraConfig(driver=self.dra_driver).check()
        if not self.tls and not _loopback(host):
            raise InvalidInput(
                f"--listen {self.listen}: the agent takes bearer tokens, so off loopback it serves HTTPS only; "
                "give --tls-ca-cert/--tls-ca-key (the agents' CA: deploy/tls/agent-ca.crt/.key, "
                "written by deploy/certs.sh) or --tls-cert/--tls-key, or listen on 127.0.0.1"
            )


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serving_files(config: AgentConfig, node: str) -> Tuple[Optional[str], Optional[str]]:
    """(cert, key) the agent serves with: given, issued from the agents' CA for this node, or none."""
    if config.tls_ca_cert and config.tls_ca_key:
        from .certs import issue_node_cert

        ips = [os.environ.get("NODE_IP", "")]
        crt, key = issue_node_cert(
            str(Path(config.state_dir) / "tls"), config.tls_ca_cert, config.tls_ca_key, node, ips
        )
        return str(crt), str(key)
    return config.tls_cert, config.tls_key


def release_orphans(pool: Pool, live_uids: Set[str], listed_at: float) -> List[Lease]:
    """Release leases of pods missing from `live_uids`.

    Only leases older than `listed_at` (when the pod list was read) are
    candidates: a pod created after the list was read is not in it yet.
    Leases without a pod label (plain `gpupool run` on the node) are kept.
    """
    released = []
    for lease in pool.status().leases:
        uid = pod_uid_of_label(lease.holder.label)
        if uid and uid not in live_uids and lease.created_at < listed_at:
            try:
                pool.release(lease.id)
            except Exception as err:  # released meanwhile: fine
                log.debug("releasing %s: %s", lease.id, err)
                continue
            log.info("released lease %s of pod %s, which no longer exists", lease.id, uid)
            released.append(lease)
    return released


def sync_tokens(store: Store, tokens_dir: str) -> int:
    """Put every token of `tokens_dir` (file name = token name) into the pool's token table,
    through the auth module; returns how many were new or changed."""
    from ..serving.server.auth import install_token

    count = 0
    for path in sorted(Path(tokens_dir).glob("*")):
        if path.name.startswith(".") or not path.is_file():
            continue  # Secret volumes keep their data in ..data symlinks
        token = path.read_text(encoding="utf-8").strip()
        if len(token) < 16:
            log.warning("token %s is shorter than 16 characters: ignored", path.name)
            continue
        if install_token(store, path.name, token):
            count += 1
    return count


LivePods = Callable[[], Optional[Tuple[Set[str], float]]]
"""A live-pod source: (UIDs of the node's pods, when that list was read), or None while unknown."""


def kube_live_pods(node: str) -> LivePods:  # pragma: no cover - needs an API server
    """UIDs of the pods on `node`, through the kubernetes client (in cluster)."""
    api = core_v1("the agent reaps leases of gone pods", "pass --no-reap (or --live-pods-file FILE)")

    def live() -> Tuple[Set[str], float]:
        listed_at = time.time()  # before the call: a pod created during it may be missing
        pods = api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        return {p.metadata.uid for p in pods.items}, listed_at

    return live


def kube_recorded(node: str) -> Callable[[int], List[Tuple[str, ...]]]:  # pragma: no cover - needs an API server
    """The GPUs the extender recorded for the Pending pods' containers on `node` that ask for N units."""
    from .choice import gpus_for_units

    api = core_v1("the device plugin reads the extender's GPU choices", "pass --no-reap (or --live-pods-file FILE)")

    def lookup(units: int) -> List[Tuple[str, ...]]:
        found = api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node},status.phase=Pending")
        pods = api.api_client.sanitize_for_serialization(found).get("items") or []
        return gpus_for_units(pods, node, units)

    return lookup


def file_live_pods(path: str) -> LivePods:
    """UIDs from a file (one per line, '#' comments), as of its modification time (tests, development).

    A missing file means "unknown", never "no pods": nothing is released until it exists.
    """

    def live() -> Optional[Tuple[Set[str], float]]:
        try:
            listed_at = os.stat(path).st_mtime
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        uids = {line.split("#", 1)[0].strip() for line in text.splitlines()}
        return uids - {""}, listed_at

    return live


def reap_once(pool: Pool, live: LivePods) -> List[Lease]:
    """One pass of the reaper: release the leases of pods missing from the live list."""
    listed = live()
    if listed is None:
        return []
    uids, listed_at = listed
    return release_orphans(pool, uids, listed_at)


def every(interval_s: float, work: Callable[[], object], stop: threading.Event, name: str) -> threading.Thread:
    """Run `work` every `interval_s` in a daemon thread, logging (not raising) its failures."""

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                work()
            except Exception:
                log.exception("%s failed", name)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread


def _exit_during_start_up(signum: int, frame: Optional[FrameType]) -> None:
    """SIGTERM/SIGINT before the server runs: stop at once (`finally` still cleans up)."""
    raise SystemExit(0)


def run_agent(config: AgentConfig) -> None:  # pragma: no cover - runs until SIGTERM; tests/kube/test_agent_process.py
    """Start the device plugin and the reapers, then serve the pool until SIGTERM."""
    from ..pooling.devices import discover
    from ..serving.server.serve import ServerConfig, prepare, run
    from .deviceplugin.plugin import DevicePlugin, PluginConfig, watch_health

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_during_start_up)  # while serving, the server's run() handles them
    node = config.node or os.environ.get("NODE_NAME", "") or os.uname().nodename
    live: Optional[LivePods] = None
    recorded = None  # the extender's GPU choices, read where the node's pods are read from the API
    if config.live_pods_file:
        live = file_live_pods(config.live_pods_file)
    elif config.in_cluster:
        live = kube_live_pods(node)  # fails here, before anything is started, outside a cluster
        recorded = kube_recorded(node)
    devices = discover(config.devices, node)
    config.check()
    dra_api = None
    if config.dra:
        from .apiclient import from_environment

        dra_api = from_environment("the DRA plugin reads ResourceClaims and writes ResourceSlices")
    cert, key = serving_files(config, node)
    prepared = prepare(
        ServerConfig(
            listen=config.listen,
            state_dir=config.state_dir,
            token_file=config.token_file,
            device_list=devices,
            node=node,
            enforcement=config.enforcement,
            preempt_mode=config.preempt_mode,
            tls_cert=cert,
            tls_key=key,
        )
    )
    port = prepared.sock.getsockname()[1]  # the bound one: --listen may say :0
    scheme = "https" if cert else "http"
    advertise = config.advertise or f"{scheme}://{os.environ.get('NODE_IP', '127.0.0.1')}:{port}"
    stop = threading.Event()
    # In mps mode the webhook mounts the agent's MPS pipe folder (STATE/mps/pipe) into GPU pods.
    # Containers get the agent's attestation folder read-only (the runner proves its pid there) from
    # Allocate, as NVIDIA's plugin gives its files: no hostPath in the pod, which stays at Pod Security baseline.
    attest = socket_path(prepared.pool.state_dir)  # the state hostPath has the same path on the host
    plugin = DevicePlugin(
        devices,
        PluginConfig(
            kubelet_dir=config.kubelet_dir,
            agent_url=advertise,
            envs={SOCKET_ENV: str(attest)},
            mounts=[(str(attest.parent), str(attest.parent), True)],
            recorded=recorded,
        ),
        mix=prepared.pool.mix,  # the pool's: one learned shape mix on the node
    )
    # On a DRA-only node the device-plugin folder may not exist: DRA serves alone there.
    with_device_plugin = config.device_plugin and (not config.dra or os.path.isdir(config.kubelet_dir))
    if config.device_plugin and not with_device_plugin:
        log.warning("no device plugin: %s does not exist (DRA only)", config.kubelet_dir)
    dra = None
    serving = False
    try:
        if config.tokens_dir and os.path.isdir(config.tokens_dir):
            tokens_dir = config.tokens_dir
            sync_tokens(prepared.pool.store, tokens_dir)
            every(30.0, lambda: sync_tokens(prepared.pool.store, tokens_dir), stop, "gpupool-token-sync")

        def health_watcher(uuids: List[str]) -> _PoolHealth:
            from ..pooling.devices.health import HealthWatcher

            return _PoolHealth(HealthWatcher(uuids), prepared.pool)

        if dra_api is not None:
            from .dra.plugin import DraConfig, DraPlugin

            dra = DraPlugin(
                prepared.pool,
                dra_api,
                DraConfig(config.kubelet_dir, config.dra_driver, config.cdi_dir, config.state_dir, node),
            )
            dra.start()
        if with_device_plugin:
            plugin.start()
        # Health also marks the pool's devices, which the DRA plugin republishes its slice from.
        watch_health(plugin, health_watcher)
        if live is not None:
            source = live
            every(config.reap_interval_s, lambda: reap_once(prepared.pool, source), stop, "gpupool-reaper")
        serving = True
        run(prepared)
    finally:
        stop.set()
        plugin.stop()
        if dra is not None:
            dra.stop()
        if not serving:  # run() closes it itself
            prepared.close()
    log.info("agent stopped")


class _PoolHealth:
    """A HealthWatcher that also tells the pool, so unhealthy GPUs get no new slices."""

    def __init__(self, watcher: HealthWatcher, pool: Pool) -> None:
        self.watcher, self.pool = watcher, pool
        self.last: Set[str] = set()

    def poll(self, timeout_ms: int) -> Set[str]:
        bad = self.watcher.poll(timeout_ms)
        if bad != self.last:  # write only on change: the pool's store is on the node's disk
            self.pool.set_device_health({d.uuid: d.uuid not in bad for d in self.pool.devices()})
            self.last = set(bad)
        return bad

    def close(self) -> None:
        self.watcher.close()
