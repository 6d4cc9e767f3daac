"""`--tls auto`: a self-signed CA and a server certificate signed by it, kept in the state dir.

The CA (not the server certificate) is what `gpupool token create` bundles as
ca.crt, so the server certificate can be reissued (new host names) without
touching the clients.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from pathlib import Path
from typing import Iterable, List, Tuple, Union

from .ca import issue_server_cert, load_ca, new_ca, write_cert, write_key

log = logging.getLogger(__name__)

TLS_DIR = "tls"
CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY = "ca.crt", "ca.key", "server.crt", "server.key"
CA_DAYS, SERVER_DAYS = 3650, 825  # 825: the longest serving certificate macOS and browsers accept


def ca_path(state_dir: Union[str, Path]) -> Path:
    return Path(state_dir) / TLS_DIR / CA_CERT


def ensure_self_signed(state_dir: Union[str, Path], names: Iterable[str] = ()) -> Tuple[Path, Path, Path]:
    """(ca.crt, server.crt, server.key) under <state>/tls, created when missing.

    The server certificate names this host (name, FQDN, its addresses,
    localhost) plus `names`; it is reissued when a wanted name is missing.
    """
    directory = Path(state_dir) / TLS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca_cert_path, ca_key_path = directory / CA_CERT, directory / CA_KEY
    cert_path, key_path = directory / SERVER_CERT, directory / SERVER_KEY

    if ca_cert_path.is_file() and ca_key_path.is_file():
        ca_cert, ca_key = load_ca(ca_cert_path, ca_key_path)
    else:
        ca_cert, ca_key = new_ca(f"gpupool CA {socket.gethostname()}", days=CA_DAYS)
        write_key(ca_key_path, ca_key)
        write_cert(ca_cert_path, ca_cert)
        log.warning("created a self-signed CA in %s", ca_cert_path)

    wanted = _host_names(names)
    if cert_path.is_file() and key_path.is_file() and _covers(cert_path, wanted):
        return ca_cert_path, cert_path, key_path

    cert, key = issue_server_cert(ca_cert, ca_key, socket.gethostname(), wanted, days=SERVER_DAYS)
    write_key(key_path, key)
    write_cert(cert_path, cert)
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
