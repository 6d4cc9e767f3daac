"""TLS material: a private CA and a serving certificate for the webhook Service, and the
node agents' own CA.

The API server and kube-scheduler verify the webhook against the CA
(`caBundle` in the webhook configurations). Rotation: run again with the same
CA (`--ca-cert/--ca-key`) to renew only the serving certificate, so `caBundle`
stays valid; the webhook re-reads its files when they change.

The agents' CA (agent-ca.crt/.key) is separate, because its key sits on every GPU node: each
agent issues itself a serving certificate for its node's IP at start (`issue_node_cert`), and
the webhook, the extender and the runner in pods verify agents against agent-ca.crt.
"""

from __future__ import annotations

import pathlib
from typing import List, Optional, Sequence, Tuple

from ..serving.server.ca import issue_server_cert, load_ca, new_ca, write_cert, write_key


def service_names(service: str, namespace: str) -> List[str]:
    """DNS names the API server uses for a Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def write_certs(
    out_dir: str,
    names: List[str],
    days: int = 365,
    ca_cert: Optional[str] = None,
    ca_key: Optional[str] = None,
    ip_addresses: Sequence[str] = (),
) -> Tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """Write ca.crt (and ca.key when new), tls.crt and tls.key (0600) under `out_dir`; return their paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if ca_cert and ca_key:
        ca, ca_private = load_ca(ca_cert, ca_key)
        write_cert(out / "ca.crt", ca)
    else:
        write_ca(out_dir, "ca", "gpupool webhook CA")
        ca, ca_private = load_ca(out / "ca.crt", out / "ca.key")
    cert, key = issue_server_cert(ca, ca_private, names[0], [*names, *ip_addresses], days)
    write_key(out / "tls.key", key)
    write_cert(out / "tls.crt", cert)
    return out / "ca.crt", out / "tls.crt", out / "tls.key"


def write_ca(out_dir: str, stem: str, common_name: str, years: int = 10) -> Tuple[pathlib.Path, pathlib.Path]:
    """A new private CA as STEM.crt and STEM.key (0600) under `out_dir`."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cert, key = new_ca(common_name, days=years * 365)
    key_path, crt_path = out / f"{stem}.key", out / f"{stem}.crt"
    write_key(key_path, key)
    write_cert(crt_path, cert)
    return crt_path, key_path


def issue_node_cert(
    out_dir: str, ca_cert: str, ca_key: str, node: str, ips: Sequence[str], days: int = 365
) -> Tuple[pathlib.Path, pathlib.Path]:
    """A serving certificate for one node agent (its node name, localhost, `ips` and 127.0.0.1),
    signed by the agents' CA; returns (tls.crt, tls.key) under `out_dir`."""
    names = [n for n in (node, "localhost") if n]
    addresses = list(dict.fromkeys([*(i for i in ips if i), "127.0.0.1"]))
    _, crt, key = write_certs(out_dir, names, days, ca_cert, ca_key, addresses)
    return crt, key
