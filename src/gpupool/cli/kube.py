"""`gpupool kube ...`: the Kubernetes side (what the deploy manifests run).

gpupool kube webhook --listen 0.0.0.0:8443 --tls-cert tls.crt --tls-key tls.key
gpupool kube agent --kubelet-dir /var/lib/kubelet/device-plugins --devices auto --listen 0.0.0.0:56001 --state /var/lib/gpupool
gpupool kube certs --out deploy/tls            # webhook CA + serving cert (again with --ca-* to rotate)
gpupool kube secret team-a --namespace team-a  # a user token: the two kubectl commands that install it
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..core.errors import InvalidInput
from ..kube.dra import DEFAULT_DRIVER
from ..kube.dra.cdi import DEFAULT_CDI_DIR
from .groups import help_when_bare
from .server import add_enforcement_arguments, add_preempt_argument, node_enforcement


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kube = subparsers.add_parser("kube", help="Kubernetes: webhooks + scheduler extender, node agent, certificates")
    verbs = kube.add_subparsers(dest="kube_command", metavar="KUBE_COMMAND")

    help_when_bare(kube)

    p = verbs.add_parser("webhook", help="serve /mutate, /validate, /healthz and the scheduler extender")
    p.add_argument("--listen", default="0.0.0.0:8443", metavar="HOST:PORT")
    p.add_argument("--tls-cert", help="serving certificate (re-read when it changes)")
    p.add_argument("--tls-key", help="its private key")
    p.add_argument(
        "--agents",
        default="kube",
        metavar="kube|NODE=URL,...",
        help="where node agents are: 'kube' (each node's InternalIP, in cluster) or a fixed map",
    )
    p.add_argument("--agent-port", type=int, default=56001)
    p.add_argument("--agent-token-file", help="admin token to read the agents' /v1/status")
    p.add_argument(
        "--agent-ca",
        metavar="FILE",
        help="the agents' CA (deploy/tls/agent-ca.crt): reach agents over HTTPS, verified, and have pods do so",
    )
    p.add_argument("--runner-image", default="ghcr.io/gpupool/gpupool:0.1.0", help="image of the runner init container")
    p.add_argument("--token-secret", default="gpupool-client", help="Secret (in each pod's namespace) with key 'token'")
    p.add_argument("--gpu-memory", help="GPU size for gpu-memory asks while no agent has reported (e.g. 80GiB)")
    p.add_argument("--wait", type=float, default=300.0, help="seconds the runner queues for its share (default 300)")
    p.add_argument("--refresh", type=float, default=2.0, help="seconds between agent polls (default 2)")
    p.add_argument(
        "--bind",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the scheduler binds GPU pods through the extender (`gpupool kube scheduler-config`, the default): "
        "each GPU container's runner claims what the bind recorded for it (gpupool.io/choice.N); --no-bind "
        "where the scheduler cannot call the extender: the runner then pins its ask to the GPUs the device "
        "plugin allocated",
    )
    p.add_argument(
        "--isolation",
        default="hooks",
        metavar="mps|hooks|none",
        help="the agents' isolation mode; mps gives GPU containers the agent's MPS pipe and /dev/shm",
    )
    p.add_argument(
        "--mps-pipe-dir",
        default="/var/lib/gpupool/mps/pipe",
        metavar="HOST_PATH",
        help="the agents' MPS pipe folder: their --state + /mps/pipe (default /var/lib/gpupool/mps/pipe)",
    )
    p.add_argument(
        "--mps-shm-dir",
        default="/run/gpupool/mps/shm",
        metavar="HOST_PATH",
        help="host folder the agents mount as /dev/shm (default /run/gpupool/mps/shm)",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="outside a pod: reach the API server with this kubeconfig (its service account's token) "
        "instead of the pod's service account",
    )
    p.set_defaults(func=handle_webhook)

    p = verbs.add_parser("agent", help="node agent: device plugin + the node's pool server")
    p.add_argument("--kubelet-dir", default="/var/lib/kubelet/device-plugins")
    p.add_argument("--devices", default="auto", help="auto (NVML), or emulated:2x16GiB for nodes without GPUs")
    p.add_argument("--listen", default="0.0.0.0:56001")
    p.add_argument("--state", default="/var/lib/gpupool", help="state dir of the node's pool")
    p.add_argument("--token-file", default="/etc/gpupool-agent/token", help="admin token file")
    p.add_argument("--tokens-dir", default="/etc/gpupool-tokens", help="user tokens, one file per name")
    p.add_argument("--node", default="", help="node name (default: env NODE_NAME)")
    p.add_argument("--advertise", default="", help="agent URL for containers (default http(s)://$NODE_IP:PORT)")
    p.add_argument("--tls-ca-cert", help="the agents' CA: the agent issues itself a certificate for its node from it")
    p.add_argument("--tls-ca-key", help="its private key")
    p.add_argument("--tls-cert", help="or a serving certificate as it is (and --tls-key)")
    p.add_argument("--tls-key", help="its private key")
    p.add_argument("--no-reap", action="store_true", help="do not release leases of gone pods (outside a cluster)")
    p.add_argument(
        "--live-pods-file",
        metavar="FILE",
        help="reap with the pod UIDs listed in FILE (one a line) instead of the API server (tests, dev)",
    )
    p.add_argument(
        "--reap-interval",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds between passes of the reaper (default 30)",
    )
    p.add_argument(
        "--dra",
        action="store_true",
        help="also serve Dynamic Resource Allocation (resource.k8s.io/v1): a kubelet DRA plugin and ResourceSlices",
    )
    p.add_argument("--driver", default=DEFAULT_DRIVER, help=f"the DRA driver name (default {DEFAULT_DRIVER})")
    p.add_argument("--cdi-dir", default=DEFAULT_CDI_DIR, help=f"where DRA writes CDI specs (default {DEFAULT_CDI_DIR})")
    p.add_argument("--no-device-plugin", action="store_true", help="with --dra: serve DRA only")
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="outside a pod: reach the API server with this kubeconfig (its service account's token) "
        "instead of the pod's service account",
    )
    add_preempt_argument(p)
    add_enforcement_arguments(p)
    p.set_defaults(func=handle_agent)

    p = verbs.add_parser("certs", help="write the webhook's CA and serving certificate")
    p.add_argument("--out", default="deploy/tls")
    p.add_argument("--service", default="gpupool-webhook")
    p.add_argument("--namespace", default="gpupool-system")
    p.add_argument("--days", type=int, default=365)
    p.add_argument(
        "--ip",
        action="append",
        default=[],
        metavar="ADDRESS",
        help="an IP address the certificate also holds, for a webhook registered by URL (repeatable)",
    )
    p.add_argument("--ca-cert", help="existing CA to renew with (rotation keeps caBundle valid)")
    p.add_argument("--ca-key")
    p.set_defaults(func=handle_certs)

    p = verbs.add_parser(
        "scheduler-config",
        help="print the kube-scheduler configuration that turns on the extender",
        description="The extender's URL uses the webhook Service's ClusterIP, which a kube-scheduler on the "
        "host network reaches (Service DNS does not resolve there); TLS checks the Service's DNS name.",
    )
    p.add_argument("--cluster-ip", required=True, help="the gpupool-webhook Service's ClusterIP")
    p.add_argument("--port", type=int, default=443, help="the Service's port (default 443), or the webhook's own")
    p.add_argument("--namespace", default="gpupool-system")
    p.add_argument("--kubeconfig", default="/etc/kubernetes/scheduler.conf", help="the scheduler's own kubeconfig")
    p.add_argument(
        "--ca-file", default="/etc/kubernetes/gpupool/ca.crt", help="deploy/tls/ca.crt, on the control plane"
    )
    p.add_argument(
        "--bind",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the extender also binds GPU pods, recording the GPUs it chose (gpupool.io/choice) for the "
        "device plugin and the runners (default); GPU pods then wait while the webhook is down. --no-bind: "
        "filter and prioritize only (then run the webhook with --no-bind too)",
    )
    p.add_argument(
        "--weight",
        type=int,
        default=5,
        metavar="N",
        help="how many times the extender's score counts against the default plugins' (1-100, default 5)",
    )
    p.set_defaults(func=handle_scheduler_config)

    p = verbs.add_parser("secret", help="print the kubectl commands that install a user token for a namespace")
    p.add_argument("name", help="token name (shown as the lease holder)")
    p.add_argument("--namespace", required=True, help="namespace of the pods that use it")
    p.add_argument("--token", help="the token (default: a new one; or a bundle's token, see --from-bundle)")
    p.add_argument("--from-bundle", metavar="CLIENT_YAML", help="take the token from a client bundle's client.yaml")
    p.add_argument(
        "--agent-ca",
        metavar="FILE",
        default="deploy/tls/agent-ca.crt",
        help="the agents' CA, put in the Secret as ca.crt so pods verify their node's agent "
        "(default deploy/tls/agent-ca.crt; left out when the file does not exist)",
    )
    p.add_argument("--system-namespace", default="gpupool-system")
    p.set_defaults(func=handle_secret)


def handle_webhook(args: argparse.Namespace) -> int:
    import threading

    from ..core.isolation_mode import IsolationMode
    from ..core.quantity import parse_memory_mib
    from ..kube.admission import WebhookApp, serve
    from ..kube.mutate import MutateConfig
    from ..kube.nodestate import ClusterState, kube_pending, kube_requeue, kube_targets, static_targets

    if bool(args.tls_cert) != bool(args.tls_key):
        raise InvalidInput("give both --tls-cert and --tls-key (the API server only calls webhooks over HTTPS)")
    mps = IsolationMode.parse(args.isolation) is IsolationMode.MPS
    for flag, path, fix in (
        ("--tls-cert", args.tls_cert, "`gpupool kube certs --out DIR` writes DIR/tls.crt"),
        ("--tls-key", args.tls_key, "`gpupool kube certs --out DIR` writes DIR/tls.key"),
        ("--agent-token-file", args.agent_token_file, "give the file that holds the node agents' admin token"),
        ("--agent-ca", args.agent_ca, "give the agents' CA certificate, deploy/tls/agent-ca.crt"),
    ):
        if path and not os.path.isfile(path):
            raise InvalidInput(f"{flag} {path!r} does not exist: {fix}")
    if args.kubeconfig:
        from ..kube.kubeconfig import use_kubeconfig

        use_kubeconfig(args.kubeconfig)
    token = Path(args.agent_token_file).read_text().strip() if args.agent_token_file else ""
    in_cluster = args.agents == "kube"
    scheme = "https" if args.agent_ca else "http"
    targets = kube_targets(args.agent_port, scheme) if in_cluster else static_targets(args.agents)
    # Before the cluster poller starts, so that a bad flag leaves no thread behind.
    config = MutateConfig(
        runner_image=args.runner_image,
        agent_port=args.agent_port,
        agent_scheme=scheme,
        token_secret=args.token_secret,
        gpu_memory_mib=parse_memory_mib(args.gpu_memory, "--gpu-memory") if args.gpu_memory else None,
        wait_s=args.wait,
        mps_pipe_dir=args.mps_pipe_dir if mps else "",
        mps_shm_dir=args.mps_shm_dir,
        pin_choice=args.bind,
    )
    api = None
    if in_cluster:  # the extender's bind verb reads and binds pods
        from ..kube.apiclient import KubeApi
        from ..kube.kubeconfig import IN_CLUSTER_ONLY, api_client

        api = KubeApi(api_client("the extender binds pods", "pass --agents NODE=URL,...", IN_CLUSTER_ONLY))
    cluster = ClusterState(
        targets,
        token=token,
        ca=args.agent_ca or "",
        pending=kube_pending() if in_cluster else None,
        freed=kube_requeue() if in_cluster else None,
    )
    cluster.start(args.refresh)
    server = serve(args.listen, WebhookApp(config, cluster, api), args.tls_cert, args.tls_key)
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"gpupool webhook listening on {'https' if args.tls_cert else 'http'}://{shown}:{port} "
        f"({'TLS' if args.tls_cert else 'plain HTTP'})",
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.shutdown()
    cluster.stop()
    return 0


def handle_agent(args: argparse.Namespace) -> int:
    from ..kube.agent import AgentConfig, run_agent

    if args.reap_interval <= 0:
        raise InvalidInput(f"--reap-interval {args.reap_interval:g}: give a positive number of seconds, e.g. 30")
    if args.kubeconfig:
        from ..kube.kubeconfig import use_kubeconfig

        use_kubeconfig(args.kubeconfig)
    config = AgentConfig(
        kubelet_dir=args.kubelet_dir,
        devices=args.devices,
        listen=args.listen,
        state_dir=args.state,
        token_file=args.token_file,
        tokens_dir=args.tokens_dir,
        node=args.node,
        advertise=args.advertise,
        in_cluster=not args.no_reap,
        live_pods_file=args.live_pods_file,
        reap_interval_s=args.reap_interval,
        enforcement=node_enforcement(args),
        preempt_mode=args.preempt,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca_cert=args.tls_ca_cert,
        tls_ca_key=args.tls_ca_key,
        dra=args.dra,
        dra_driver=args.driver,
        cdi_dir=args.cdi_dir,
        device_plugin=not args.no_device_plugin,
    )
    config.check()  # before anything starts
    run_agent(config)
    return 0


def handle_certs(args: argparse.Namespace) -> int:
    from ..kube.certs import service_names, write_ca, write_certs
    from ..kube.manifests import write_ca_patch

    if bool(args.ca_cert) != bool(args.ca_key):
        raise InvalidInput("give both --ca-cert and --ca-key to renew with an existing CA, or neither")
    import ipaddress

    for address in args.ip:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise InvalidInput(f"--ip {address!r} is not an IP address, e.g. --ip 127.0.0.1") from None
    ca, crt, key = write_certs(
        args.out, service_names(args.service, args.namespace), args.days, args.ca_cert, args.ca_key, args.ip
    )
    wrote = [str(ca), str(crt), str(key)]
    if not (Path(args.out) / "agent-ca.crt").exists():  # kept across rotations: every agent issues from it
        wrote += [str(p) for p in write_ca(args.out, "agent-ca", "gpupool agent CA")]
    patch = write_ca_patch(args.out, ca.read_bytes())
    print(f"wrote {', '.join(wrote)} and {patch}", file=sys.stderr)
    return 0


def handle_scheduler_config(args: argparse.Namespace) -> int:
    import yaml

    from ..kube.manifests import scheduler_config

    config = scheduler_config(
        args.cluster_ip,
        namespace=args.namespace,
        port=args.port,
        kubeconfig=args.kubeconfig,
        ca_file=args.ca_file,
        bind=args.bind,
        weight=args.weight,
    )
    sys.stdout.write(yaml.safe_dump(config, sort_keys=False))
    return 0


def handle_secret(args: argparse.Namespace) -> int:
    import json
    import secrets
    import shlex

    from ..serving.server.auth import check_name

    name = check_name(args.name)
    token = args.token
    if args.from_bundle:
        with open(args.from_bundle, encoding="utf-8") as f:
            servers = json.load(f).get("servers") or []
        token = next((s.get("token") for s in servers if s.get("token")), None)
        if not token:
            raise InvalidInput(f"{args.from_bundle} holds no server token: write the bundle with a token")
    token = token or secrets.token_urlsafe(32)
    patch = json.dumps({"stringData": {name: token}})
    print(f"kubectl -n {args.system_namespace} patch secret gpupool-tokens --type merge -p {shlex.quote(patch)}")
    ca = f" --from-file=ca.crt={shlex.quote(args.agent_ca)}" if args.agent_ca and os.path.isfile(args.agent_ca) else ""
    print(
        f"kubectl -n {shlex.quote(args.namespace)} create secret generic gpupool-client "
        f"--from-literal=token={shlex.quote(token)}{ca}"
    )
    return 0
