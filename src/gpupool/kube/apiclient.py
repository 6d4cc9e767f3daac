"""JSON calls to the Kubernetes API server: the DRA plugin's (ResourceClaims, ResourceSlices) and
the extender bind's (read and annotate a pod, create its Binding).

Through the kubernetes package's own ApiClient (its configuration loaders, TLS, credentials and
token refresh, its HTTP transport), with plain JSON in and out: resource.k8s.io/v1 objects are
read as the API documents them, and the tests point it at a local stub by its host alone.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

TIMEOUT_S = 10.0


class ApiError(Exception):
    """The API server answered an error status (`status`), or could not be reached (status 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class KubeApi:
    """JSON requests to the API server that `client` (a kubernetes ApiClient) is configured for."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    @classmethod
    def at(cls, host: str) -> KubeApi:
        """The API server at `host`, with no credentials (a local stub, a `kubectl proxy`)."""
        from kubernetes.client import ApiClient, Configuration

        return cls(ApiClient(Configuration(host=host)))

    @property
    def server(self) -> str:
        return str(self.client.configuration.host)

    def request(
        self, method: str, path: str, body: Optional[Dict[str, Any]] = None, content_type: str = "application/json"
    ) -> Dict[str, Any]:
        """One call; the decoded JSON answer, or ApiError with the server's own message.

        Args:
            content_type: of the body; a PATCH names its kind (application/merge-patch+json ...).
        """
        from urllib3.exceptions import HTTPError

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            call = self.client.param_serialize(
                method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
            )
            response = self.client.call_api(*call, _request_timeout=TIMEOUT_S)
            data = response.read()
        except (HTTPError, OSError) as err:
            raise ApiError(0, f"{method} {path}: the API server at {self.server} is not reachable ({err})") from None
        if not 200 <= response.status < 300:
            raise ApiError(response.status, f"{method} {path}: {response.status} {_status_message(data, response)}")
        try:
            answer: Dict[str, Any] = json.loads(data or b"{}")
        except ValueError as err:
            raise ApiError(0, f"{method} {path}: the API server at {self.server} answered no JSON ({err})") from None
        return answer


def _status_message(data: bytes, response: Any) -> str:
    """The `message` of the Status object the API server sends with an error, else the reason phrase."""
    try:
        return str(json.loads(data).get("message") or response.reason)
    except (ValueError, AttributeError):
        return str(response.reason)


def from_environment(purpose: str) -> KubeApi:  # pragma: no cover - needs a cluster or a kubeconfig
    """The API server of the pod's service account, else of $KUBECONFIG (~/.kube/config); a clear
    one-line error when neither is there."""
    from .kubeconfig import IN_CLUSTER_FIRST, api_client

    return KubeApi(api_client(purpose, "set KUBECONFIG", IN_CLUSTER_FIRST))
