"""A thin JSON client of the Kubernetes API server for the DRA plugin: GET a ResourceClaim, write
ResourceSlices. It finds the server as the agent does (in cluster, else $KUBECONFIG) through the
kubernetes package's config loaders, then speaks plain HTTP(S) with the standard library, so
the tests point it at a local stub and resource.k8s.io/v1 needs no generated client class.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ...core.errors import InvalidInput

TIMEOUT_S = 10.0


class ApiError(Exception):
    """The API server answered an error status (`status`), or could not be reached (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class KubeApi:
    """The API server at `server`; `token` is a callable so a rotated service-account token is used."""

    server: str
    token: Callable[[], str] = lambda: ""
    context: Optional[ssl.SSLContext] = None

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """One call; the decoded JSON answer, or ApiError with the server's own message."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server.rstrip("/") + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        token = self.token()
        if token:
            req.add_header("Authorization", token if token.startswith("Bearer ") else f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S, context=self.context) as resp:
                answer: Dict[str, Any] = json.loads(resp.read() or b"{}")
                return answer
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, f"{method} {path}: {err.code} {_status_message(err)}") from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise ApiError(0, f"{method} {path}: the API server at {self.server} is not reachable ({reason})") from None


def _status_message(err: urllib.error.HTTPError) -> str:
    """The `message` of the Status object the API server sends with an error, else the reason phrase."""
    try:
        status = json.loads(err.read())
        return str(status.get("message") or err.reason)
    except (ValueError, AttributeError, OSError):
        return str(err.reason)


def from_environment(purpose: str) -> KubeApi:  # pragma: no cover - needs a cluster or a kubeconfig
    """The API server of the pod's service account, else of $KUBECONFIG (~/.kube/config); a clear
    one-line error when neither is there."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except config.ConfigException:
        try:
            config.load_kube_config(client_configuration=cfg, persist_config=False)
        except (config.ConfigException, OSError) as err:
            raise InvalidInput(
                f"{purpose} through the Kubernetes API, not reachable here: not in a cluster and no "
                f"kubeconfig ({str(err).rstrip('.')}); set KUBECONFIG"
            ) from None
    context: Optional[ssl.SSLContext] = None
    if cfg.host.startswith("https"):
        context = (
            ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
        )
        if cfg.cert_file and cfg.key_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify_ssl:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE

    def token() -> str:
        return str(cfg.get_api_key_with_prefix("authorization") or "")

    return KubeApi(cfg.host, token, context)
