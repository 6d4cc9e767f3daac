"""The webhook server: AdmissionReview (admission.k8s.io/v1) at /mutate and /validate, the
scheduler extender at /extender/filter and /extender/prioritize, and /healthz.

Standard library HTTP/1.1 over TLS, one thread per connection (the API server
keeps connections alive), TLS handshakes in that thread rather than the accept
loop, and the certificate re-read when its file changes (rotation without restart).
Bad input gets a 4xx or a deny with a message, never a 500.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Tuple

from ..core.errors import InvalidInput
from . import extender
from .mutate import MutateConfig, mutate
from .nodestate import ClusterState
from .validate import validate

log = logging.getLogger(__name__)
MAX_BODY = 8 * 1024 * 1024  # the API server's own request limit is about 3 MiB


class WebhookApp:
    """Routes a request (path, body) to an answer (status, JSON); no sockets here."""

    def __init__(self, config: MutateConfig, cluster: ClusterState) -> None:
        self.config = config
        self.cluster = cluster

    def handle(self, method: str, path: str, body: bytes) -> Tuple[int, Any]:
        path = path.split("?", 1)[0].rstrip("/") or "/"
        if method == "GET" and path in ("/healthz", "/readyz"):
            return 200, {"status": "ok", "nodes": len(self.cluster.states())}
        routes = {
            "/mutate": self._mutate,
            "/validate": self._validate,
            "/extender/filter": self._filter,
            "/extender/prioritize": self._prioritize,
        }
        if path not in routes:
            return 404, {"error": {"code": "not_found", "message": f"no route {path}; use /mutate, /validate, "
                                   "/extender/filter, /extender/prioritize or /healthz"}}
        if method != "POST":
            return 405, {"error": {"code": "method_not_allowed", "message": f"{path} takes POST"}}
        try:
            data = json.loads(body or b"null")
        except ValueError as err:
            return 400, {"error": {"code": "invalid_input", "message": f"body is not JSON: {err}"}}
        if not isinstance(data, dict):
            return 400, {"error": {"code": "invalid_input", "message": "body must be a JSON object"}}
        return routes[path](data)

    # -- admission -------------------------------------------------------
    def _review(self, data: Dict[str, Any]) -> Tuple[Optional[Dict[str, Any]], Optional[Tuple[int, Any]]]:
        request = data.get("request")
        if not isinstance(request, dict) or not request.get("uid"):
            return None, (400, {"error": {"code": "invalid_input",
                                          "message": "not an AdmissionReview: request.uid is missing"}})
        return request, None

    @staticmethod
    def _answer(data: Dict[str, Any], uid: str, allowed: bool, message: str = "", patch=None, warnings=()) -> Dict[str, Any]:
        response: Dict[str, Any] = {"uid": uid, "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
        if warnings:
            response["warnings"] = list(warnings)
        return {"apiVersion": data.get("apiVersion") or "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": response}

    def _pod(self, request: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        kind = (request.get("kind") or {}).get("kind", "Pod")
        obj = request.get("object")
        if kind != "Pod" or not isinstance(obj, dict) or request.get("operation", "CREATE") != "CREATE":
            return None  # scoped: only pod creation is ours; anything else passes untouched
        return obj

    def _mutate(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        request, bad = self._review(data)
        if bad:
            return bad
        uid = request["uid"]
        pod = self._pod(request)
        if pod is None:
            return 200, self._answer(data, uid, True)
        try:
            out = mutate(pod, self.config, self.cluster.gpu_size)
        except InvalidInput as err:
            return 200, self._answer(data, uid, False, "gpupool: " + err.message)
        except Exception:  # fail safe: leave the pod as it is; the validating webhook names any problem
            log.exception("mutating pod %s failed", uid)
            return 200, self._answer(data, uid, True, warnings=["gpupool webhook error: the pod was not changed"])
        return 200, self._answer(data, uid, True, patch=out.patch, warnings=out.warnings)

    def _validate(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        request, bad = self._review(data)
        if bad:
            return bad
        uid = request["uid"]
        pod = self._pod(request)
        if pod is None:
            return 200, self._answer(data, uid, True)
        try:
            verdict = validate(pod, self.cluster.node_devices)
        except Exception:
            log.exception("validating pod %s failed", uid)
            return 200, self._answer(data, uid, True, warnings=["gpupool webhook error: the pod was not checked"])
        message = "" if verdict.allowed else "gpupool: " + verdict.message
        return 200, self._answer(data, uid, verdict.allowed, message, warnings=verdict.warnings)

    # -- scheduler extender ---------------------------------------------
    def _filter(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        try:
            return 200, extender.handle_filter(data, self.cluster.states())
        except Exception as err:  # the protocol reports errors in the result, with HTTP 200
            log.exception("extender filter failed")
            return 200, {"Error": f"gpupool extender: {err}"}

    def _prioritize(self, data: Dict[str, Any]) -> Tuple[int, Any]:
        try:
            return 200, extender.handle_prioritize(data, self.cluster.states())
        except Exception:
            log.exception("extender prioritize failed")
            return 200, []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses connections
    server_version = "gpupool-webhook"
    timeout = 120  # idle keep-alive connections end after this, freeing their thread

    def log_message(self, fmt: str, *args: Any) -> None:  # route access logs to logging, at debug
        log.debug("%s " + fmt, self.address_string(), *args)

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._send(413, {"error": {"code": "invalid_input", "message": f"body over {MAX_BODY} bytes"}})
            self.close_connection = True
            return
        body = self.rfile.read(length) if length else b""
        status, answer = self.server.app.handle(method, self.path, body)  # type: ignore[attr-defined]
        self._send(status, answer)

    def _send(self, status: int, answer: Any) -> None:
        payload = json.dumps(answer, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        self._serve("POST")

    def do_GET(self) -> None:
        self._serve("GET")


class CertReloader:
    """An SSLContext rebuilt when the cert or key file changes (checked at most every `period_s`)."""

    def __init__(self, cert: str, key: str, period_s: float = 10.0) -> None:
        self.cert, self.key, self.period_s = cert, key, period_s
        self._stamp: Tuple[float, float] = (0.0, 0.0)
        self._checked = 0.0
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
                if (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime) != self._stamp:
                    self._context = self._load()
                    log.info("reloaded TLS certificate %s", self.cert)
            except (OSError, ssl.SSLError) as err:  # half-written files during a rotation: keep the old one
                log.warning("keeping the current TLS certificate: %s", err)
        return self._context


class WebhookServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that does each TLS handshake in the connection's own thread."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: Tuple[str, int], app: WebhookApp, certs: Optional[CertReloader] = None) -> None:
        self.app = app
        self.certs = certs
        super().__init__(address, _Handler)

    def finish_request(self, request: socket.socket, client_address: Any) -> None:
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.certs is not None:
            request.settimeout(10.0)  # a client that never finishes its handshake must not hold a thread
            try:
                request = self.certs.context().wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as err:
                log.debug("TLS handshake from %s failed: %s", client_address, err)
                return
            request.settimeout(None)
        super().finish_request(request, client_address)


def serve(listen: str, app: WebhookApp, cert: Optional[str] = None, key: Optional[str] = None) -> WebhookServer:
    """A started server on `listen` ('host:port'); call shutdown() to stop it."""
    host, _, port = listen.rpartition(":")
    certs = CertReloader(cert, key) if cert and key else None
    server = WebhookServer((host or "0.0.0.0", int(port)), app, certs)
    threading.Thread(target=server.serve_forever, name="gpupool-webhook", daemon=True).start()
    return server
