"""The one CA builder: private CAs, the serving and client certificates they sign, and how they reach the disk.

Used by `--tls auto` (server.tls) and by the Kubernetes certificates (kube.certs: the webhook's
CA and the node agents'), and by the local control plane of tools/kube_cluster (the API server's
serving and client certificates). A private key is written 0600 from its creation, whatever the umask:
a new file opened O_EXCL with mode 0600 beside the target, then renamed over it, so no reader
ever sees it wider, nor half written (the webhook re-reads its files when they change).
cryptography is imported where it is used: the server starts without it when TLS is off.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, List, Sequence, Tuple, Union

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

    SigningKey = Union[
        rsa.RSAPrivateKey,
        dsa.DSAPrivateKey,
        ec.EllipticCurvePrivateKey,
        ed25519.Ed25519PrivateKey,
        ed448.Ed448PrivateKey,
    ]

PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644
# Issued certificates start this far in the past: a peer whose clock is a little behind accepts them.
BACKDATE = datetime.timedelta(minutes=5)


def write_file(path: Union[str, Path], data: bytes, mode: int) -> None:
    """Write `data` to `path` with exactly `mode`, atomically: a new file created with `mode`
    (O_EXCL, so never an existing file of wider mode), then renamed over `path`."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(temporary, flags, mode)  # the umask can only narrow it
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # exactly `mode`, also for a public file under umask 077
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def write_key(path: Union[str, Path], key: SigningKey) -> None:
    """`key` as unencrypted PKCS#8 PEM, 0600 from its creation."""
    from cryptography.hazmat.primitives import serialization

    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_file(path, pem, PRIVATE_MODE)


def write_cert(path: Union[str, Path], cert: x509.Certificate) -> None:
    """`cert` as PEM, readable by all (a certificate is public)."""
    from cryptography.hazmat.primitives import serialization

    write_file(path, cert.public_bytes(serialization.Encoding.PEM), PUBLIC_MODE)


def signing_key(key: object, source: object) -> SigningKey:
    """`key` if it can sign certificates, else the TypeError CertificateBuilder.sign would raise, naming `source`."""
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

    signers = (
        rsa.RSAPrivateKey,
        dsa.DSAPrivateKey,
        ec.EllipticCurvePrivateKey,
        ed25519.Ed25519PrivateKey,
        ed448.Ed448PrivateKey,
    )
    if not isinstance(key, signers):
        raise TypeError(f"{source}: a {type(key).__name__} cannot sign certificates")
    return key


def load_ca(cert_path: Union[str, Path], key_path: Union[str, Path]) -> Tuple[x509.Certificate, SigningKey]:
    """A CA's certificate and signing key from PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    return cert, signing_key(key, key_path)


def new_ca(common_name: str, days: int) -> Tuple[x509.Certificate, SigningKey]:
    """A self-signed CA (P-256) that signs serving certificates only (path length 0)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue_server_cert(
    ca_cert: x509.Certificate, ca_key: SigningKey, common_name: str, names: Sequence[str], days: int
) -> Tuple[x509.Certificate, SigningKey]:
    """A serving certificate (P-256) signed by the CA for `names`: each an IP address or a DNS name."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    alt: List[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def issue_client_cert(
    ca_cert: x509.Certificate, ca_key: SigningKey, user: str, groups: Sequence[str], days: int
) -> Tuple[x509.Certificate, SigningKey]:
    """A client certificate (P-256) signed by the CA for `user` (CN) in `groups` (O, one per
    group): how the Kubernetes API server reads a client certificate's identity."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
    subject.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key
