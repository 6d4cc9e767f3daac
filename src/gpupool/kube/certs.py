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

import datetime
import pathlib
from typing import List, Optional, Sequence, Tuple


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
    """Write ca.crt (and ca.key when new), tls.crt and tls.key under `out_dir`; return their paths."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    from ..server.tls import signing_key

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    pem = serialization.Encoding.PEM
    if ca_cert and ca_key:
        ca = x509.load_pem_x509_certificate(pathlib.Path(ca_cert).read_bytes())
        ca_private = serialization.load_pem_private_key(pathlib.Path(ca_key).read_bytes(), password=None)
    else:
        write_ca(out_dir, "ca", "gpupool webhook CA")
        ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
        ca_private = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    ca_signer = signing_key(ca_private, ca_key or out / "ca.key")
    key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ip_addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_signer, hashes.SHA256())
    )
    (out / "ca.crt").write_bytes(ca.public_bytes(pem))
    (out / "tls.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (out / "tls.key").chmod(0o600)
    (out / "tls.crt").write_bytes(cert.public_bytes(pem))
    return out / "ca.crt", out / "tls.crt", out / "tls.key"


def write_ca(out_dir: str, stem: str, common_name: str, years: int = 10) -> Tuple[pathlib.Path, pathlib.Path]:
    """A new private CA as STEM.crt and STEM.key (0600) under `out_dir`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=years * 365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_path, crt_path = out / f"{stem}.key", out / f"{stem}.crt"
    key_path.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    key_path.chmod(0o600)
    crt_path.write_bytes(ca.public_bytes(pem))
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
