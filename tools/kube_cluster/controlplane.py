"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok, from the binaries tools/kube-cluster/build.sh builds.

Everything lives in one state folder: the PKI (one CA from gpupool's CA builder signs the
serving certificates and the client certificates that are the components' identities), the
kubeconfigs, etcd's data, the logs and, for `up`/`down`, the pid files. Two steps, so that
gpupool's side can start between them: `start_apiserver` (etcd and the API server, waited for
at /readyz), then `start_controllers` (controller-manager, scheduler with the caller's
configuration, kwok). `stop` ends every process it started: SIGTERM to each process group,
SIGKILL after a grace period.

Ports are free loopback ports picked just before a component starts; another process can take
one in between, so a component that fails to bind is started again on new ports.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

from gpupool.kube.certs import write_ca
from gpupool.kube.resources import UNITS, UNITS_PER_GPU
from gpupool.serving.server.ca import issue_client_cert, issue_server_cert, load_ca, write_cert, write_file, write_key
from gpupool.workload.runner.prctl import parent_death_signal

from . import kwok_stages

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "tools" / "kube-cluster" / "build.sh"
DEFAULT_STATE = ROOT / ".cluster"
KUBE_RELEASE = "v1.37.2"
LOOPBACK = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's ClusterIP: the first of SERVICE_CIDR
POD_CIDR = "10.244.0.1/16"  # kwok hands pod IPs out of it
ISSUER = "https://kubernetes.default.svc"
# DRA: resource.k8s.io/v1 and consumable capacity (beta and on by default in 1.37; named so that
# the test bed does not change under a release that turns it off).
RUNTIME_CONFIG = "resource.k8s.io/v1=true"
FEATURE_GATES = "DRAConsumableCapacity=true"
ADMIN = ("gpupool-admin", ("system:masters",))
FRONT_PROXY_CLIENT = "front-proxy-client"  # the API server's identity towards aggregated API servers
KUBELET_CLIENT = "kube-apiserver-kubelet-client"  # the API server's identity towards kubelets (logs, exec)
# Node shape for simulated GPU nodes (the gpupool side's agents find node i at its own loopback IP).
NODE_PREFIX = "gpu-node-"
NODE_CPU, NODE_MEMORY, NODE_PODS = "32", "256Gi", "110"
NODE_LABELS = {"gpupool.io/agent": "true", "type": "kwok"}
FIRST_NODE_IP = 10  # node i has InternalIP 127.0.0.(FIRST_NODE_IP + i)
CERT_DAYS = 30
STOP_GRACE_S = 10.0
START_TIMEOUT_S = 180.0  # a loaded 2-core machine takes tens of seconds for the API server
PORT_TRIES = 3

T = TypeVar("T")


class GoMissing(RuntimeError):
    """No `go` on PATH: the components cannot be built here."""


class StartFailed(RuntimeError):
    """A component exited or never became ready; the message ends with its log's tail."""


def build(components: Sequence[str] = ()) -> Path:
    """The bin folder with `components` (build.sh's default set when empty), built if missing
    (cold: tens of minutes on 2 cores), else at once from the cache."""
    if shutil.which("go") is None:
        raise GoMissing("`go` is not on PATH: the test bed builds Kubernetes from its Go modules (Go 1.26)")
    out = subprocess.run([str(BUILD_SCRIPT), *components], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free now on `host` (loopback by default)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def node_name(index: int) -> str:
    return f"{NODE_PREFIX}{index}"


def node_ip(index: int) -> str:
    return f"127.0.0.{FIRST_NODE_IP + index}"


def wait_for(predicate: Callable[[], Optional[T]], timeout: float, what: str, interval: float = 0.2) -> T:
    """Poll `predicate` until it returns something true; StartFailed naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise StartFailed(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def _start_time(pid: int) -> Optional[str]:
    """The kernel's start time of `pid` (field 22 of /proc/PID/stat), or None if it is gone:
    with the pid, it names one process, not a later one that reuses the number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass
class Component:
    """One started process: its name, its log, and how to end it."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def failed(self, what: str) -> StartFailed:
        code = self.process.poll()
        state = f"exited with {code}" if code is not None else "still running"
        return StartFailed(f"{self.name} {what} ({state}); log {self.log}:\n{self.tail()}")


def end_process_group(pid: int, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to the group `pid` leads, then SIGKILL if any member is left after `grace`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


@dataclass
class ControlPlane:
    """A control plane in `state_dir` from the binaries in `bin_dir`.

    `detach`: the processes outlive this Python process (`up`; `down` ends them through the pid
    files); otherwise each dies with it (the pytest fixture)."""

    state_dir: Path
    bin_dir: Path
    detach: bool = False
    components: List[Component] = field(default_factory=list)
    server: str = ""

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        self.bin_dir = Path(self.bin_dir)
        self.pki = self.state_dir / "pki"
        self.logs = self.state_dir / "logs"
        self.pids = self.state_dir / "pids"
        self.admin_kubeconfig = self.state_dir / "admin.kubeconfig"
        self.scheduler_kubeconfig = self.state_dir / "scheduler.kubeconfig"
        self.controller_manager_kubeconfig = self.state_dir / "controller-manager.kubeconfig"
        self.kwok_kubeconfig = self.state_dir / "kwok.kubeconfig"
        self.ca_cert = self.pki / "ca.crt"
        self.ca_key = self.pki / "ca.key"
        self.kubectl = self.bin_dir / "kubectl"

    # ---- lifecycle

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start_apiserver(self) -> None:
        """etcd and kube-apiserver, with the PKI and kubeconfigs; returns once /readyz is ok."""
        for folder in (self.pki, self.logs, self.pids):
            folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o700)  # keys and etcd's data: for this user alone
        self._write_pki()
        for attempt in range(PORT_TRIES):
            etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
            etcd = self._start_etcd(etcd_port, peer_port)
            api = self._start("kube-apiserver", self._apiserver_args(etcd_port, api_port))
            self.server = f"https://{LOOPBACK}:{api_port}"
            try:
                wait_for(functools.partial(self._ready, api, etcd), START_TIMEOUT_S, "kube-apiserver /readyz")
                break
            except StartFailed:
                bind_failed = any("address already in use" in c.tail(200) for c in (etcd, api))
                self._end(api)
                self._end(etcd)
                if not bind_failed or attempt == PORT_TRIES - 1:
                    raise api.failed("did not become ready") from None
        for user, groups, path in (
            (*ADMIN, self.admin_kubeconfig),
            ("system:kube-scheduler", (), self.scheduler_kubeconfig),
            ("system:kube-controller-manager", (), self.controller_manager_kubeconfig),
            # kwok plays every node's kubelet (node and pod status, leases of many nodes): the
            # Node authorizer admits one node per identity, so kwok is an administrator.
            ("kwok-controller", ("system:masters",), self.kwok_kubeconfig),
        ):
            self.kubeconfig_for(user, groups, path)

    def start_controllers(self, scheduler_config: Optional[Path] = None) -> None:
        """kube-controller-manager, kube-scheduler (`scheduler_config` as its --config, else a
        plain one) and kwok; returns once each works."""
        cm_port, sched_port = free_port(), free_port()
        cm = self._start("kube-controller-manager", self._controller_manager_args(cm_port))
        if scheduler_config is None:
            scheduler_config = self.state_dir / "scheduler-config.yaml"
            plain = {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(self.scheduler_kubeconfig)},
                "leaderElection": {"leaderElect": False},
            }
            scheduler_config.write_text(json.dumps(plain, indent=2))
        sched = self._start("kube-scheduler", self._scheduler_args(Path(scheduler_config), sched_port))
        kwok = self._start("kwok", self._kwok_args())
        # The serviceaccount controller's first work: pods can be created once `default` exists.
        wait_for(
            lambda: self.alive(cm) and self._get("/api/v1/namespaces/default/serviceaccounts/default"),
            START_TIMEOUT_S,
            "kube-controller-manager (the default ServiceAccount)",
        )
        wait_for(
            lambda: self.alive(sched) and self._healthy(sched_port, "/readyz"),
            START_TIMEOUT_S,
            "kube-scheduler /readyz",
        )
        self.alive(kwok)

    def stop(self) -> None:
        """End every process started, newest first; nothing is left (SIGKILL after the grace)."""
        while self.components:
            self._end(self.components[-1])

    # ---- identities

    def kubeconfig_for(self, user: str, groups: Sequence[str] = (), path: Optional[Path] = None) -> Path:
        """A kubeconfig for `user` in `groups` (a client certificate from the cluster's CA)."""
        stem = user.replace(":", "-")
        path = path or self.state_dir / f"{stem}.kubeconfig"
        ca, ca_key = load_ca(self.ca_cert, self.ca_key)
        cert, key = issue_client_cert(ca, ca_key, user, groups, CERT_DAYS)
        crt_path, key_path = self.pki / f"{stem}.crt", self.pki / f"{stem}.key"
        write_key(key_path, key)
        write_cert(crt_path, cert)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "gpupool", "cluster": {"server": self.server, "certificate-authority": str(self.ca_cert)}}
            ],
            "users": [{"name": user, "user": {"client-certificate": str(crt_path), "client-key": str(key_path)}}],
            "contexts": [{"name": "gpupool", "context": {"cluster": "gpupool", "user": user}}],
            "current-context": "gpupool",
        }
        write_file(path, json.dumps(config, indent=2).encode(), 0o600)
        return path

    # ---- nodes

    def add_nodes(self, count: int, gpus: int, first: int = 0) -> List[str]:
        """`count` simulated GPU nodes (gpu-node-FIRST…), each with `gpus` GPUs as gpupool's
        units; returns their names once kwok has made each Ready and schedulable."""
        names = []
        for index in range(first, first + count):
            name = node_name(index)
            capacity = {"cpu": NODE_CPU, "memory": NODE_MEMORY, "pods": NODE_PODS, UNITS: str(gpus * UNITS_PER_GPU)}
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {**NODE_LABELS, "kubernetes.io/hostname": name},
                    "annotations": dict([kwok_stages.NODE_ANNOTATION]),
                },
                "status": {
                    "capacity": capacity,
                    "allocatable": capacity,
                    "addresses": [
                        {"type": "InternalIP", "address": node_ip(index)},
                        {"type": "Hostname", "address": name},
                    ],
                },
            }
            self._request("POST", "/api/v1/nodes", node)
            names.append(name)
        for name in names:
            wait_for(functools.partial(self.node_ready, name), START_TIMEOUT_S, f"node {name} Ready and untainted")
        return names

    def node_ready(self, name: str) -> bool:
        """Node `name` is Ready and carries no node.kubernetes.io taint."""
        node = self._get(f"/api/v1/nodes/{name}")
        if not node:
            return False
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        # The node lifecycle controller taints a node not-ready until it has seen it Ready.
        taints = [t for t in node.get("spec", {}).get("taints", []) if t["key"].startswith("node.kubernetes.io/")]
        return conditions.get("Ready") == "True" and not taints

    # ---- the pieces

    def _write_pki(self) -> None:
        """The cluster CA, serving certificates and the service-account signing key."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        write_ca(str(self.pki), "ca", "gpupool test-bed cluster CA")
        ca, ca_key = load_ca(self.ca_cert, self.ca_key)
        names = [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
            LOOPBACK,
            SERVICE_IP,
        ]
        cert, key = issue_server_cert(ca, ca_key, "kube-apiserver", names, CERT_DAYS)
        write_key(self.pki / "serving.key", key)
        write_cert(self.pki / "serving.crt", cert)
        # The API server is etcd's client (etcd checks client certificates against the CA).
        cert, key = issue_client_cert(ca, ca_key, "kube-apiserver-etcd-client", (), CERT_DAYS)
        write_key(self.pki / "etcd-client.key", key)
        write_cert(self.pki / "etcd-client.crt", cert)
        # The aggregation layer's front proxy: its own CA, so that no client certificate of the
        # cluster CA can assert another user in request headers.
        write_ca(str(self.pki), "front-proxy-ca", "gpupool test-bed front-proxy CA")
        proxy_ca, proxy_ca_key = load_ca(self.pki / "front-proxy-ca.crt", self.pki / "front-proxy-ca.key")
        cert, key = issue_client_cert(proxy_ca, proxy_ca_key, FRONT_PROXY_CLIENT, (), CERT_DAYS)
        write_key(self.pki / "front-proxy-client.key", key)
        write_cert(self.pki / "front-proxy-client.crt", cert)
        # Towards a real kubelet (kubelet_node.py), which authorizes this user through the API
        # server (SubjectAccessReview), as kubeadm sets it up.
        cert, key = issue_client_cert(ca, ca_key, KUBELET_CLIENT, (), CERT_DAYS)
        write_key(self.pki / "kubelet-client.key", key)
        write_cert(self.pki / "kubelet-client.crt", cert)
        sa_key = ec.generate_private_key(ec.SECP256R1())
        write_key(self.pki / "sa.key", sa_key)
        public = sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        write_file(self.pki / "sa.pub", public, 0o644)

    def _start_etcd(self, port: int, peer_port: int) -> Component:
        data = self.state_dir / "etcd"
        data.mkdir(mode=0o700, exist_ok=True)
        peer = f"http://{LOOPBACK}:{peer_port}"
        client = f"https://{LOOPBACK}:{port}"
        return self._start(
            "etcd",
            [
                "--name=default",
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                f"--cert-file={self.pki / 'serving.crt'}",
                f"--key-file={self.pki / 'serving.key'}",
                "--client-cert-auth",
                f"--trusted-ca-file={self.ca_cert}",
                # A test bed's store: losing it on a power cut costs nothing, fsync costs seconds.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _apiserver_args(self, etcd_port: int, port: int) -> List[str]:
        return [
            f"--etcd-servers=https://{LOOPBACK}:{etcd_port}",
            f"--etcd-cafile={self.ca_cert}",
            f"--etcd-certfile={self.pki / 'etcd-client.crt'}",
            f"--etcd-keyfile={self.pki / 'etcd-client.key'}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            "--endpoint-reconciler-type=none",  # loopback: no endpoints for the kubernetes Service
            f"--secure-port={port}",
            f"--tls-cert-file={self.pki / 'serving.crt'}",
            f"--tls-private-key-file={self.pki / 'serving.key'}",
            f"--client-ca-file={self.ca_cert}",
            f"--requestheader-client-ca-file={self.pki / 'front-proxy-ca.crt'}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-uid-headers=X-Remote-Uid",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={self.pki / 'front-proxy-client.key'}",
            f"--kubelet-client-certificate={self.pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={self.pki / 'kubelet-client.key'}",
            f"--kubelet-certificate-authority={self.ca_cert}",
            # A node's Hostname is its name, which no resolver here knows; its InternalIP is real.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={self.pki / 'sa.pub'}",
            f"--service-account-signing-key-file={self.pki / 'sa.key'}",
            "--authorization-mode=Node,RBAC",
            # The defaults (webhooks, ServiceAccount, …) plus what a real cluster runs beside Node.
            "--enable-admission-plugins=NodeRestriction",
            f"--runtime-config={RUNTIME_CONFIG}",
            f"--feature-gates={FEATURE_GATES}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
        ]

    def _controller_manager_args(self, port: int) -> List[str]:
        return [
            f"--kubeconfig={self.controller_manager_kubeconfig}",
            f"--authentication-kubeconfig={self.controller_manager_kubeconfig}",
            f"--authorization-kubeconfig={self.controller_manager_kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--tls-cert-file={self.pki / 'serving.crt'}",
            f"--tls-private-key-file={self.pki / 'serving.key'}",
            "--leader-elect=false",
            # Each controller acts as its own service account, as in a real cluster.
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.pki / 'sa.key'}",
            f"--root-ca-file={self.ca_cert}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--feature-gates={FEATURE_GATES}",
            "--profiling=false",
        ]

    def _scheduler_args(self, config: Path, port: int) -> List[str]:
        return [
            f"--config={config}",
            f"--authentication-kubeconfig={self.scheduler_kubeconfig}",
            f"--authorization-kubeconfig={self.scheduler_kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--tls-cert-file={self.pki / 'serving.crt'}",
            f"--tls-private-key-file={self.pki / 'serving.key'}",
            f"--feature-gates={FEATURE_GATES}",
            "--profiling=false",
        ]

    def _kwok_args(self) -> List[str]:
        stages = self.state_dir / "kwok-stages.yaml"
        stages.write_text("\n---\n".join(json.dumps(s) for s in kwok_stages.stages()))
        key, value = kwok_stages.NODE_ANNOTATION
        return [
            f"--kubeconfig={self.kwok_kubeconfig}",
            f"--config={stages}",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
        ]

    # ---- processes

    def _start(
        self,
        name: str,
        args: List[str],
        bin_dir: Optional[Path] = None,
        env: Optional[Dict[str, str]] = None,
        wrapper: Sequence[str] = (),
    ) -> Component:
        log = self.logs / f"{name}.log"
        if name == "kwok":  # kwok reads ~/.kwok: its home is the state folder, so a user's file is not read
            env = {"HOME": str(self.state_dir), **(env or {})}
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [*wrapper, str((bin_dir or self.bin_dir) / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                env={**os.environ, **env} if env else None,
                start_new_session=True,  # its own group: a terminal's Ctrl-C reaches `down`, not it
                # Tied to this process unless detached: kill -9 of a test run ends them too.
                preexec_fn=None if self.detach else parent_death_signal(),
            )
        component = Component(name, process, log)
        self.components.append(component)
        start = _start_time(process.pid)
        (self.pids / f"{name}.pid").write_text(f"{process.pid} {start}\n")
        return component

    def start_process(
        self,
        name: str,
        bin_dir: Path,
        args: List[str],
        env: Optional[Dict[str, str]] = None,
        wrapper: Sequence[str] = (),
    ) -> Component:
        """Another component (binary `name` in `bin_dir`, run through the command `wrapper` if
        any) started, logged and ended as the control plane's own are (Kueue's controller)."""
        return self._start(name, args, bin_dir, env, wrapper)

    def end(self, component: Component) -> None:
        """End one started component (SIGTERM, SIGKILL after the grace)."""
        self._end(component)

    def _end(self, component: Component) -> None:
        end_process_group(component.process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            component.process.wait(timeout=STOP_GRACE_S)
        (self.pids / f"{component.name}.pid").unlink(missing_ok=True)
        if component in self.components:
            self.components.remove(component)

    @staticmethod
    def alive(component: Component) -> bool:
        """True while `component` runs; StartFailed with its log's tail once it has exited."""
        if component.process.poll() is not None:
            raise component.failed("exited")
        return True

    # ---- the API

    def _ssl(self, client: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        if client:
            context.load_cert_chain(self.pki / f"{ADMIN[0]}.crt", self.pki / f"{ADMIN[0]}.key")
        return context

    def _ready(self, api: Component, etcd: Component) -> bool:
        self.alive(etcd)
        self.alive(api)
        port = int(self.server.rsplit(":", 1)[1])
        return self._healthy(port, "/readyz")

    @staticmethod
    def http_ok(port: int, path: str) -> bool:
        """`path` answers 200 over plain HTTP on the loopback `port` (a health probe)."""
        try:
            conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False

    def _healthy(self, port: int, path: str) -> bool:
        """`path` answers 200 on the loopback `port` (TLS checked against the cluster CA)."""
        try:
            conn = http.client.HTTPSConnection(LOOPBACK, port, context=self._ssl(client=False), timeout=5)
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False

    def _request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Tuple[int, Any]:
        """One call to the API server as the administrator: (status, decoded JSON)."""
        port = int(self.server.rsplit(":", 1)[1])
        conn = http.client.HTTPSConnection(LOOPBACK, port, context=self._ssl(), timeout=30)
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        payload = answer.read()
        decoded = json.loads(payload) if payload else None
        if answer.status >= 400 and not (method == "GET" and answer.status == 404):
            raise StartFailed(f"{method} {path}: HTTP {answer.status} {payload[:300]!r}")
        return answer.status, decoded

    def _get(self, path: str) -> Optional[Dict[str, Any]]:
        try:
            status, body = self._request("GET", path)
        except (OSError, http.client.HTTPException):
            return None
        return body if status == 200 else None


def down(state_dir: Path) -> List[str]:
    """End every process `up` started in `state_dir` (pid files; a reused pid is left alone),
    then remove the folder; returns the names ended."""
    ended = []
    pids = Path(state_dir) / "pids"
    for pid_file in sorted(pids.glob("*.pid")) if pids.is_dir() else []:
        pid_text, _, start = pid_file.read_text().strip().partition(" ")
        pid = int(pid_text)
        if _start_time(pid) == start:
            end_process_group(pid)
            ended.append(pid_file.stem)
    shutil.rmtree(state_dir, ignore_errors=True)
    return ended


@contextlib.contextmanager
def running(
    state_dir: Path,
    bin_dir: Path,
    nodes: int = 0,
    gpus: int = 0,
    scheduler_config: Optional[Path] = None,
) -> Iterator[ControlPlane]:
    """A whole control plane (and `nodes` GPU nodes) for the length of a `with` block."""
    plane = ControlPlane(state_dir, bin_dir)
    try:
        plane.start_apiserver()
        plane.start_controllers(scheduler_config)
        if nodes:
            plane.add_nodes(nodes, gpus)
        yield plane
    finally:
        plane.stop()
