"""`--tls auto`: a self-signed CA and a server certificate signed by it, kept in the state dir.

The CA (not the server certificate) is what `gpupool token create` bundles as
ca.crt, so the server certificate can be reissued (new host names) without
touching the clients.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, List, Tuple, Union

if TYPE_CHECKING:  # cryptography is imported where it is used: the server starts without it when TLS is off
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

    SigningKey = Union[
        rsa.RSAPrivateKey,
        dsa.DSAPrivateKey,
        ec.EllipticCurvePrivateKey,
        ed25519.Ed25519PrivateKey,
        ed448.Ed448PrivateKey,
    ]

log = logging.getLogger(__name__)

TLS_DIR = "tls"
CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.crt", "server.key"


def ca_path(state_dir: Union[str, Path]) -> Path:
    return Path(state_dir) / TLS_DIR / CA_CERT


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


def ensure_self_signed(state_dir: Union[str, Path], names: Iterable[str] = ()) -> Tuple[Path, Path, Path]:
    """(ca.crt, server.crt, server.key) under <state>/tls, created when missing.

    The server certificate names this host (name, FQDN, its addresses,
    localhost) plus `names`; it is reissued when a wanted name is missing.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory = Path(state_dir) / TLS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_cert_path, ca_key_path = directory / CA_CERT, directory / CA_KEY
    cert_path, key_path = directory / SERVER_CERT, directory / SERVER_KEY
    now = datetime.datetime.now(datetime.timezone.utc)

    if ca_cert_path.is_file() and ca_key_path.is_file():
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpupool CA {socket.gethostname()}")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        _write(
            ca_key_path,
            ca_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
            0o600,
        )
        _write(ca_cert_path, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
        log.warning("created a self-signed CA in %s", ca_cert_path)

    wanted = _host_names(names)
    if cert_path.is_file() and key_path.is_file() and _covers(cert_path, wanted):
        return ca_cert_path, cert_path, key_path

    ca_key = signing_key(ca_key, ca_key_path)
    key = ec.generate_private_key(ec.SECP256R1())
    alt: List[x509.GeneralName] = []
    for name in wanted:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, socket.gethostname())]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=825))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(
        key_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        0o600,
    )
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    log.warning("issued server certificate %s for %s", cert_path, ", ".join(wanted))
    return ca_cert_path, cert_path, key_path


def _host_names(extra: Iterable[str]) -> List[str]:
    names = ["localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()]
    try:
        names.extend(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    names.extend(n for n in extra if n and n not in ("0.0.0.0", "::"))
    seen: List[str] = []
    for n in names:
        if n and n not in seen:
            seen.append(n)
    return seen


def _covers(cert_path: Path, names: List[str]) -> bool:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {str(v) for v in san.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    expires = cert.not_valid_after_utc
    fresh = expires - datetime.datetime.now(datetime.timezone.utc) > datetime.timedelta(days=30)
    return fresh and all(n in have for n in names)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, mode)
