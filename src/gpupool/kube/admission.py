"""The webhook server: AdmissionReview (admission.k8s.io/v1) at /mutate and /validate, the
scheduler extender at /extender/filter, /extender/prioritize and /extender/bind, and /healthz.

HTTP/1.1 over TLS on gpupool's one listener (`webserver` on `server.listener`: connection, head,
body and in-flight limits, the app called inline), and the certificate re-read when its file
changes (rotation without restart).
Bad input gets a 4xx or a deny with a message, never a 500.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..core.errors import GpupoolError, InvalidInput
from ..core.fragmentation import LearnedMix
from ..serving.server.listener import parse_listen
from ..serving.server.wire import json_object
from . import extender
from .apiclient import KubeApi
from .binder import handle_bind
from .mutate import MutateConfig, mutate
from .nodestate import ClusterState
from .validate import validate
from .webhook_metrics import WebhookMetrics
from .webserver import MAX_BODY, WebServer

log = logging.getLogger(__name__)
ROUTE_NAMES = {
    "/mutate": "mutate",
    "/validate": "validate",
    "/extender/filter": "filter",
    "/extender/prioritize": "prioritize",
    "/extender/bind": "bind",
}


class WebhookApp:
    """Routes a request (path, body) to an answer (status, JSON); no sockets here."""

    def __init__(self, config: MutateConfig, cluster: ClusterState, api: Optional[KubeApi] = None) -> None:
        self.config = config
        self.cluster = cluster
        self.api = api  # the API server, for the bind verb (records the pod's choice, then binds)
        self.metrics = WebhookMetrics()
        # fragaware's mix: the claims of the pods prioritized here (in memory: a restart learns again)
        self.mix = LearnedMix()
        # One bind at a time: each places its pod on the state the previous one left (assumed).
        self._bind_lock = threading.Lock()

    def handle(self, method: str, path: str, body: bytes) -> Tuple[int, Any]:
        """Answer one request; admission and extender calls are counted and timed for GET /metrics."""
        path = path.split("?", 1)[0].rstrip("/") or "/"
        if method == "GET" and path == "/metrics":
            return 200, self.metrics.text()
        started = time.perf_counter()
        status, answer = self._route(method, path, body)
        self.metrics.observe(ROUTE_NAMES.get(path, ""), status, time.perf_counter() - started)
        return status, answer

    def _route(self, method: str, path: str, body: bytes) -> Tuple[int, Any]:
        if method == "GET" and path in ("/healthz", "/readyz"):
            return 200, {"status": "ok", "nodes": len(self.cluster.states())}
        routes = {
            "/mutate": self._mutate,
            "/validate": self._validate,
            "/extender/filter": self._filter,
            "/extender/prioritize": self._prioritize,
            "/extender/bind": self._bind,
        }
        if path not in routes:
            return 404, {
                "error": {
                    "code": "not_found",
                    "message": f"no route {path}; use /mutate, /validate, "
                    "/extender/filter, /extender/prioritize, /extender/bind or /healthz",
                }
            }
        if method != "POST":
            return 405, {"error": {"code": "method_not_allowed", "message": f"{path} takes POST"}}
        try:
            data = json_object(body, MAX_BODY)  # the one reader of JSON bodies (size, depth, UTF-8)
        except GpupoolError as err:
            return err.http_status, err.to_dict()
        return routes[path](data)

    # -- admission -------------------------------------------------------
    def _review(self, data: Dict[str, Any]) -> Union[Dict[str, Any], Tuple[int, Any]]:
        """The review's request, or the (status, body) answer when it is not an AdmissionReview."""
        request = data.get("request")
        if not isinstance(request, dict) or not request.get("uid") or not isinstance(request["uid"], str):
            return (
                400,
                {
                    "error": {
                        "code": "invalid_input",
                        "message": "not an AdmissionReview: request.uid must be a non-empty string",
                    }
                },
            )
        if not isinstance(request.get("kind") or {}, dict):
            # The answer must stay an AdmissionReview; a kind that is not a GroupVersionKind
            # object would otherwise fail in _pod and reach the client as a 500.
            return (
                400,
                {
                    "error": {
                        "code": "invalid_input",
                        "message": "not an AdmissionReview: request.kind must be an object",
                    }
                },
            )
        return request

    @staticmethod
    def _answer(
        data: Dict[str, Any],
        uid: str,
        allowed: bool,
        message: str = "",
        patch: Optional[List[Dict[str, Any]]] = None,
        warnings: Sequence[str] = (),
    ) -> Dict[str, Any]:
        response: Dict[str, Any] = {"uid": uid, "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
        if warnings:
            response["warnings"] = list(warnings)
        return {
            "apiVersion": data.get("apiVersion") or "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }

    def _pod(self, request: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        kind = (request.get("kind") or {}).get("kind", "Pod")
        obj = request.get("object")
        if kind != "Pod" or not isinstance(obj, dict) or request.get("operation", "CREATE") != "CREATE":
            return None  # scoped: only pod creation is ours; anything else passes untouched
        return obj

    def _admit(self, data: Dict[str, Any], decide: Callable[[str, Dict[str, Any]], Dict[str, Any]]) -> Tuple[int, Any]:
        """Check the review, pass what is not a pod creation, else answer with `decide(uid, pod)`."""
        request = self._review(data)
        if isinstance(request, tuple):  # not an AdmissionReview: the error answer
            return request
        uid = request["uid"]
        pod = self._pod(request)
        if pod is None:
            return 200, self._answer(data, uid, True)
        return 200, decide(uid, pod)

    def _mutate(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        def decide(uid: str, pod: Dict[str, Any]) -> Dict[str, Any]:
            try:
                out = mutate(pod, self.config, self.cluster.gpu_size)
            except InvalidInput as err:
                return self._answer(data, uid, False, "gpupool: " + err.message)
            except Exception:  # fail safe: leave the pod as it is; the validating webhook names any problem
                log.exception("mutating pod %s failed", uid)
                return self._answer(data, uid, True, warnings=["gpupool webhook error: the pod was not changed"])
            return self._answer(data, uid, True, patch=out.patch, warnings=out.warnings)

        return self._admit(data, decide)

    def _validate(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        def decide(uid: str, pod: Dict[str, Any]) -> Dict[str, Any]:
            try:
                verdict = validate(pod, self.cluster.node_devices)
            except Exception:
                log.exception("validating pod %s failed", uid)
                return self._answer(data, uid, True, warnings=["gpupool webhook error: the pod was not checked"])
            message = "" if verdict.allowed else "gpupool: " + verdict.message
            return self._answer(data, uid, verdict.allowed, message, warnings=verdict.warnings)

        return self._admit(data, decide)

    # -- scheduler extender ---------------------------------------------
    def _filter(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        try:
            return 200, extender.handle_filter(data, self.cluster.states())
        except Exception as err:  # the protocol reports errors in the result, with HTTP 200
            log.exception("extender filter failed")
            return 200, {"Error": f"gpupool extender: {err}"}

    def _prioritize(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        try:
            return 200, extender.handle_prioritize(data, self.cluster.states(), self.mix)
        except Exception:
            log.exception("extender prioritize failed")
            return 200, []

    def _bind(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        if self.api is None:
            return 200, {"Error": "gpupool extender: bind needs the Kubernetes API: start the webhook in a cluster"}
        try:
            with self._bind_lock:
                return 200, handle_bind(data, self.cluster.states(), self.api, self.mix.frag, self.cluster.assume)
        except Exception as err:  # the protocol reports errors in the result, with HTTP 200
            log.exception("extender bind failed")
            return 200, {"Error": f"gpupool extender: {err}"}


class CertReloader:
    """One SSLContext whose certificate is reloaded in place when the cert or key file changes.

    `context()` is called for each new connection (checking the files at most every
    `period_s`); connections already open keep the certificate they started with.
    """

    def __init__(self, cert: str, key: str, period_s: float = 10.0) -> None:
        self.cert, self.key, self.period_s = cert, key, period_s
        self._stamp: Tuple[float, float] = (0.0, 0.0)
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self._context = self._load()

    def _load(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        ctx.set_alpn_protocols(["http/1.1"])
        self._stamp = (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)
        return ctx

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked < self.period_s:
            return self._context
        with self._lock:
            self._checked = now
            try:
                stamp = (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)
                if stamp != self._stamp:
                    # Check the pair on a scratch context first: a failed load_cert_chain
                    # could leave the live one with a new cert and the old key.
                    self._load()
                    self._context.load_cert_chain(self.cert, self.key)
                    log.info("reloaded TLS certificate %s", self.cert)
            except (OSError, ssl.SSLError) as err:  # half-written files during a rotation: keep the old one
                log.warning("keeping the current TLS certificate: %s", err)
        return self._context


def serve(listen: str, app: WebhookApp, cert: Optional[str] = None, key: Optional[str] = None) -> WebServer:
    """A started server on `listen` ('host:port'); call shutdown() to stop it."""
    certs = CertReloader(cert, key) if cert and key else None
    server = WebServer(parse_listen(listen), app.handle, certs.context if certs else None)
    return server.start()
