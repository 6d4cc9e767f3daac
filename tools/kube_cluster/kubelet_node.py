"""A real node beside kwok's: containerd and the kubelet, in a pid and mount namespace of their own.

kwok plays the kubelet of the simulated nodes; this is the one node where the real kubelet
(built with the control plane) runs pods with containerd and runc from Debian's packages. So the
kubelet itself drives gpupool's device plugin (registration, ListAndWatch, Allocate) and DRA
kubelet plugin (NodePrepareResources), and pods get real cgroups below `kubepods`.

- **Namespaces.** `unshare --pid --fork --mount` runs `NODE_SCRIPT` as the namespace's first process;
  containerd, its shims, the containers and the kubelet are all below it. When it ends (the
  kubelet or containerd exits, `stop()`, or kill -9 of whoever started it: unshare dies with its
  parent and takes its child with it), the kernel kills every process in the namespace, so no
  container outlives the node. The mount namespace holds containerd's overlay mounts and the bind
  mount of the kubelet's device-plugin folder, which the kubelet only looks for at
  /var/lib/kubelet/device-plugins: the node's own folder is mounted there, for the kubelet alone.
- **Identity.** The kubelet is `system:node:NAME` in `system:nodes` (a client certificate of the
  cluster CA; the Node authorizer and NodeRestriction apply), serves TLS with a certificate of the
  same CA for its IP, and accepts the API server's client certificate, authorizing it through the
  API server (Webhook mode; the API server's user is bound to `system:kubelet-api-admin`).
- **Image.** No registry can be reached: `oci_image.busybox_image` builds the one image here, and
  containerd imports it before the kubelet starts. It is also the pod sandbox image.
- **Network.** CNI's `ptp`: each pod has its own network namespace with a veth to the node and an
  address from the node's pod range, and reaches the node's address (its agent) through it. The
  namespaces are mounted inside the node's mount namespace, so they, their veths and routes go
  with it.
- **cgroups (v1).** The kubelet's default root, so pods live below `kubepods` as on any node;
  `stop()` removes the empty groups it leaves. One real node runs on a machine at a time (a lock).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, List, Optional

from gpupool.serving.server.ca import issue_server_cert, load_ca, write_cert, write_key

from . import oci_image
from .controlplane import (
    CERT_DAYS,
    KUBELET_CLIENT,
    NODE_LABELS,
    NODE_PREFIX,
    START_TIMEOUT_S,
    Component,
    ControlPlane,
    StartFailed,
    free_port,
    node_name,
    wait_for,
)

COMPONENT_PREFIX = "kubelet-node-"  # the node's component (and pid file) name: this + the node's name
IMAGE = "gpupool.local/busybox:1"  # the node's one image: pause and the test pods' image
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # the kubelet's fixed folder
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"  # the kubelet's pod hierarchy below its (default) cgroup root
LOCK = Path("/run/gpupool-kubelet-node.lock")  # one real node per machine: /var/lib/kubelet is one
LOCK_WAIT_S = 900.0
# Debian: containerd, runc, containernetworking-plugins (ptp, host-local), busybox-static.
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
REQUIRED = ("containerd", "ctr", "runc", "unshare", "ip")
# A real node's labels: gpupool's agent runs there (the webhook finds it); not kwok's.
LABELS = {key: value for key, value in NODE_LABELS.items() if key != "type"}
# The kubelet refuses a loopback node IP: a real node's address is one from TEST-NET-2 (RFC 5737,
# never routed) put on the loopback device for the node's life.
REAL_NODE_NET = "198.51.100."
FIRST_REAL_HOST = 10
POD_NET = "10.245."  # real node i's pods: 10.245.i.0/24 (kwok's have 10.244.0.0/16)
EVICTION = {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"}

NODE_SCRIPT = r"""#!/bin/bash
# The real node's first process in its own pid and mount namespaces (kubelet_node.py).
set -eu
mount --bind "$NODE_DEVICE_PLUGINS" /var/lib/kubelet/device-plugins
containerd --config "$NODE_STATE/containerd.toml" >>"$NODE_LOGS/containerd.log" 2>&1 &
for _ in $(seq 300); do [ -S "$NODE_STATE/containerd.sock" ] && break; sleep 0.1; done
ctr --address "$NODE_STATE/containerd.sock" -n k8s.io images import "$NODE_STATE/image.tar" >/dev/null
"$NODE_KUBELET" "$@" >>"$NODE_LOGS/kubelet.log" 2>&1 &
# Either one ending ends the node: this process's exit kills the whole namespace.
wait -n
"""


class NodeUnavailable(RuntimeError):
    """This machine cannot run a real node (a missing package or no root); the message names the fix."""


def missing_parts() -> Optional[str]:
    """Why a real node cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "a real kubelet node needs root (mounts, cgroups, namespaces)"
    absent = [name for name in REQUIRED if shutil.which(name) is None]
    if not any(Path(d, "ptp").exists() for d in CNI_BIN_DIRS):
        absent.append("the CNI ptp plugin")
    if not oci_image.have_busybox():
        absent.append("a static busybox")
    if absent:
        return (
            f"missing {', '.join(absent)}: apt-get install containerd runc containernetworking-plugins busybox-static"
        )
    if not (CGROUP_ROOT / "memory").is_dir():
        return "a real kubelet node here expects cgroup v1 hierarchies under /sys/fs/cgroup"
    return None


@dataclass
class KubeletNode:
    """Node `index` of the cluster (`node_name(index)` at `real_node_ip(index)`), its kubelet's root
    folder `root` (gpupool's agent for the node is given `root`/device-plugins) and its own state."""

    cp: ControlPlane
    index: int
    root: Path
    state: Path
    component: Optional[Component] = None
    files: Dict[str, Path] = field(default_factory=dict)  # added to the node's image: path there -> file here
    port: int = 0
    _lock: Optional[IO[bytes]] = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return node_name(self.index)

    @property
    def ip(self) -> str:
        return real_node_ip(self.index)

    @property
    def component_name(self) -> str:
        return f"{COMPONENT_PREFIX}{self.name}"

    @property
    def device_plugins(self) -> Path:
        return self.root / "device-plugins"

    @property
    def containerd_socket(self) -> Path:
        return self.state / "containerd.sock"

    def start(self) -> KubeletNode:
        """Containerd and the kubelet; returns once the kubelet has registered its node and the
        node is Ready and untainted."""
        why = missing_parts()
        if why:
            raise NodeUnavailable(why)
        self._take_lock()
        try:
            self._prepare()
            self.component = self.cp.start_process(
                self.component_name,
                self.state,
                self._kubelet_args(),
                env=self._env(),
                wrapper=[
                    "unshare",
                    "--pid",
                    "--fork",
                    "--mount",
                    "--propagation",
                    "private",
                    "--mount-proc",
                    "--kill-child=SIGKILL",
                    "--",
                ],
            )
            wait_for(self._ready, START_TIMEOUT_S, f"the kubelet's node {self.name} Ready")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End the namespace (every container with it), then remove the cgroups the pods had."""
        if self.component is not None:
            self.cp.end(self.component)
            self.component = None
        clean_up(self.index)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    def log(self, name: str = "kubelet") -> str:
        """The kubelet's (or containerd's) log so far."""
        try:
            return (self.logs / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    # ---- pieces

    def _take_lock(self) -> None:
        """Wait for the machine's one real node to be free (another test run may hold it)."""
        self._lock = open(LOCK, "wb")  # noqa: SIM115 - held for the node's life, closed by stop()
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._lock.close()
                    self._lock = None
                    raise NodeUnavailable(
                        f"another real kubelet node ran here for {LOCK_WAIT_S:g} s ({LOCK} is held)"
                    ) from None
                time.sleep(1)

    def _prepare(self) -> None:
        for folder in (self.state, self.logs, self.root, self.device_plugins, self.state / "cni"):
            folder.mkdir(parents=True, exist_ok=True)
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)  # the bind mount's target
        remove_pod_cgroups()  # what a node killed before left
        add_address(self.ip)
        script = self.state / self.component_name  # start_process runs the component's name in its folder
        script.write_text(NODE_SCRIPT)
        script.chmod(0o755)
        oci_image.busybox_image(IMAGE, self.state / "image.tar", self.files)
        (self.state / "cni" / "10-gpupool-node.conflist").write_text(json.dumps(self._cni_config()))
        (self.state / "containerd.toml").write_text(self._containerd_config())
        self._write_identity()
        self.port = free_port(self.ip)
        (self.state / "kubelet-config.json").write_text(json.dumps(self._kubelet_config(), indent=2))
        self._bind_api_server_user()

    def _cni_config(self) -> Dict[str, Any]:
        """Each pod its own veth to the node (`ptp`) and an address from the node's pod range,
        recorded in the node's state (containerd's CRI wants an eth0 with an address)."""
        ipam = {
            "type": "host-local",
            "ranges": [[{"subnet": self.pod_cidr}]],
            "routes": [{"dst": "0.0.0.0/0"}],  # the node's addresses (its agent) through the veth
            "dataDir": str(self.state / "ipam"),
        }
        plugin = {"type": "ptp", "ipMasq": False, "ipam": ipam}
        return {"cniVersion": "1.0.0", "name": "gpupool-node", "plugins": [plugin]}

    @property
    def pod_cidr(self) -> str:
        return f"{POD_NET}{self.index}.0/24"

    def _containerd_config(self) -> str:
        cni_bin = next(d for d in CNI_BIN_DIRS if Path(d, "ptp").exists())
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return "\n".join(
            [
                "version = 2",
                f'root = "{self.state / "containerd-root"}"',
                f'state = "{self.state / "containerd-state"}"',
                "[grpc]",
                f'  address = "{self.containerd_socket}"',
                f"[{cri}]",
                f'  sandbox_image = "{IMAGE}"',
                # This machine lets no process lower its OOM score (the kubelet asks -998 for a
                # sandbox): containerd keeps each at its own, as for a rootless node.
                "  restrict_oom_score_adj = true",
                f"[{cri}.cni]",
                f'  bin_dir = "{cni_bin}"',
                f'  conf_dir = "{self.state / "cni"}"',
                f"[{cri}.containerd]",
                '  snapshotter = "overlayfs"',
                "",
            ]
        )

    def _write_identity(self) -> None:
        """The kubelet's kubeconfig (system:node:NAME) and its serving certificate for its IP."""
        self.cp.kubeconfig_for(f"system:node:{self.name}", ["system:nodes"], self.state / "kubelet.kubeconfig")
        ca, ca_key = load_ca(self.cp.ca_cert, self.cp.ca_key)
        cert, key = issue_server_cert(ca, ca_key, f"system:node:{self.name}", [self.ip, self.name], CERT_DAYS)
        write_key(self.state / "kubelet-serving.key", key)
        write_cert(self.state / "kubelet-serving.crt", cert)

    def _bind_api_server_user(self) -> None:
        """The API server may read logs and exec in pods on kubelets (kubeadm's binding)."""
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "gpupool-test-bed:kube-apiserver-kubelet-client"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:kubelet-api-admin",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": KUBELET_CLIENT}],
        }
        subprocess.run(
            [str(self.cp.kubectl), "--kubeconfig", str(self.cp.admin_kubeconfig), "apply", "-f", "-"],
            input=json.dumps(binding),
            text=True,
            capture_output=True,
            check=True,
            timeout=60,
        )

    def _kubelet_config(self) -> Dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": self.port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "tlsCertFile": str(self.state / "kubelet-serving.crt"),
            "tlsPrivateKeyFile": str(self.state / "kubelet-serving.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cp.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,  # this machine's cgroups are v1 (the kubelet refuses them by default)
            "failSwapOn": False,
            "evictionHard": EVICTION,  # a shared disk is not this node's pressure
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "clusterDomain": "cluster.local",
            "resolvConf": "",
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
        }

    def _kubelet_args(self) -> List[str]:
        labels = ",".join(f"{key}={value}" for key, value in {**LABELS, "kubernetes.io/hostname": self.name}.items())
        return [
            f"--config={self.state / 'kubelet-config.json'}",
            f"--kubeconfig={self.state / 'kubelet.kubeconfig'}",
            f"--root-dir={self.root}",
            f"--cert-dir={self.state / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            f"--node-labels={labels}",
            "--v=1",
        ]

    def _env(self) -> Dict[str, str]:
        return {
            "NODE_STATE": str(self.state),
            "NODE_LOGS": str(self.logs),
            "NODE_DEVICE_PLUGINS": str(self.device_plugins),
            "NODE_KUBELET": str(self.cp.bin_dir / "kubelet"),
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }

    def _ready(self) -> bool:
        if self.component is not None and self.component.process.poll() is not None:
            raise StartFailed(
                f"the real node {self.name} exited:\n{self.log()[-3000:]}\n{self.log('containerd')[-1500:]}"
            )
        return self.cp.node_ready(self.name)


def started_in(pids: Path) -> List[int]:
    """The indices of the real nodes whose pid files are in `pids` (a detached cluster's)."""
    prefix = COMPONENT_PREFIX + NODE_PREFIX
    names = (p.stem[len(prefix) :] for p in pids.glob(f"{prefix}*.pid")) if pids.is_dir() else iter(())
    return [int(n) for n in names if n.isdigit()]


def clean_up(index: int) -> None:
    """What real node `index` leaves outside its namespaces: the pods' empty cgroups and its address
    (`stop()` calls it; after a kill -9 of the node's starter, `make cluster-down` or a test does)."""
    remove_pod_cgroups()
    remove_address(real_node_ip(index))


def real_node_ip(index: int) -> str:
    return f"{REAL_NODE_NET}{FIRST_REAL_HOST + index}"


def add_address(ip: str) -> None:
    """`ip` on the loopback device (already there: left from a node killed before, kept)."""
    done = subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], capture_output=True, text=True)
    if done.returncode != 0 and "already assigned" not in done.stderr and "File exists" not in done.stderr:
        raise NodeUnavailable(f"cannot add the real node's address {ip} to lo: {done.stderr.strip()}")


def remove_address(ip: str) -> None:
    subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], capture_output=True)


def remove_pod_cgroups(timeout: float = 10.0) -> None:
    """Remove the `kubepods` groups in every v1 hierarchy, deepest first, once empty (the
    namespace's processes die a moment after its first one)."""
    deadline = time.monotonic() + timeout
    for hierarchy in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else []:
        top = hierarchy / KUBEPODS
        if not top.is_dir() or top.is_symlink():
            continue
        groups = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for group in [*groups, top]:
            while True:
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
