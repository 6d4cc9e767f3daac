"""The webhook's HTTP server: keep-alive, pipelining, malformed requests, limits, certificate rotation."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import time

import pytest
from waiting import wait_until

from gpupool.kube.admission import CertReloader, WebhookApp
from gpupool.kube.certs import write_certs
from gpupool.kube.mutate import MutateConfig
from gpupool.kube.webserver import Limits, WebhookASGI, WebServer


@pytest.fixture
def webhook_limits(tls, cluster):
    """The webhook with short deadlines: 1 s for a head, 1.5 s for a body, a 24 MB body budget."""
    limits = Limits(budget=24_000_000, body_timeout_s=1.5)
    reloader = CertReloader(tls["crt"], tls["key"])
    app = WebhookApp(MutateConfig(), cluster)
    server = WebServer(("127.0.0.1", 0), app.handle, reloader.context, limits, head_timeout_s=1.0).start()
    yield server.server_address[1], tls["ca"], limits
    server.shutdown()


def _raw(port: int, ca: str) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=ca)
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost")


def _read_answers(sock: ssl.SSLSocket, count: int):
    buf, answers = b"", []
    while len(answers) < count:
        data = sock.recv(65536)
        if not data:
            break
        buf += data
        while b"\r\n\r\n" in buf:
            head, rest = buf.split(b"\r\n\r\n", 1)
            length = int(
                next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            )
            if len(rest) < length:
                break
            raw = rest[:length]
            try:
                body = json.loads(raw)
            except ValueError:  # the server's own plain-text 400 for what it cannot parse
                body = raw.decode()
            answers.append((int(head.split(b" ")[1]), head.lower(), body))
            buf = rest[length:]
    return answers


def test_pipelined_requests_are_answered_in_order(webhook):
    sock = _raw(webhook["port"], webhook["ca"])
    sock.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 3 + b"POST /nowhere HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"
    )
    answers = _read_answers(sock, 4)
    assert [a[0] for a in answers] == [200, 200, 200, 404]
    sock.close()


def test_bad_requests_get_4xx_and_close(webhook):
    for request, status in (
        (b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST /mutate HTTP/1.1\r\nContent-Length: zebra\r\n\r\n", 400),
        (b"POST /mutate HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", 413),
        (b"NONSENSE\r\n\r\n", 400),
    ):
        sock = _raw(webhook["port"], webhook["ca"])
        sock.sendall(request)
        answers = _read_answers(sock, 1)
        assert answers and answers[0][0] == status, request
        assert b"connection: close" in answers[0][1]
        assert sock.recv(100) == b""  # closed by the server
        sock.close()


def test_connection_close_and_expect_continue(webhook):
    sock = _raw(webhook["port"], webhook["ca"])
    sock.sendall(b"POST /validate HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n")
    assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
    sock.sendall(b"{}")
    answers = _read_answers(sock, 1)
    assert answers[0][0] == 400 and sock.recv(100) == b""
    sock.close()


def test_issue_10_requests_get_4xx_at_once(webhook):
    """Duplicate or negative Content-Length and deeply nested JSON: a 4xx at once, never a hang or 500."""
    nested = b"[" * 100_000 + b"]" * 100_000
    for request, status in (
        (b"POST /mutate HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400),
        (b"POST /mutate HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400),
        (b"POST /mutate HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400),
        (b"POST /mutate HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(nested), nested), 400),
    ):
        sock = _raw(webhook["port"], webhook["ca"])
        sock.settimeout(60)
        started = time.monotonic()
        sock.sendall(request)
        answers = _read_answers(sock, 1)
        assert answers and answers[0][0] == status, request[:80]
        # "at once": the old server waited for its head timeout (30 s) on some
        assert time.monotonic() - started < 20
        sock.close()


@pytest.mark.slow
def test_stalled_uploads_hold_little_memory(tls, cluster):
    """20 clients announce 8 MB bodies and stall: at most the in-flight budget is read; the
    rest get 503, and the stalled ones 408 when their time is up. The body timer (15 s) outlasts
    the 20 connections on a loaded machine: no stalled upload times out, freeing budget for a
    later one, before the last has been refused."""
    limits = Limits(budget=24_000_000, body_timeout_s=15)
    reloader = CertReloader(tls["crt"], tls["key"])
    server = WebServer(("127.0.0.1", 0), WebhookApp(MutateConfig(), cluster).handle, reloader.context, limits).start()
    socks = []
    try:
        for _ in range(20):
            sock = _raw(server.server_address[1], tls["ca"])
            sock.sendall(b"POST /mutate HTTP/1.1\r\nContent-Length: 8000000\r\n\r\n" + b" " * 65536)
            socks.append(sock)
        assert limits.reading <= limits.budget
        for sock in socks:
            sock.settimeout(60)
        answers = [_read_answers(s, 1) for s in socks]
        statuses = [a[0][0] for a in answers if a]
        assert len(statuses) == 20 and set(statuses) <= {408, 503}, statuses
        assert statuses.count(503) >= 20 - limits.budget // 8_000_000, statuses
        assert limits.reading == 0
    finally:
        for sock in socks:
            sock.close()
        server.shutdown()


def test_slow_request_head_is_cut_off(webhook_limits, monkeypatch):
    port, ca, _ = webhook_limits
    sock = _raw(port, ca)
    sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")  # ... and never the rest of the head
    sock.settimeout(60)
    started = time.monotonic()
    assert sock.recv(100) == b""  # closed by the server
    assert time.monotonic() - started < 20  # by its 1 s head timer, not the default 30 s


def test_certificate_rotation_in_place(tmp_path):
    first = tmp_path / "one"
    ca1, crt, key = write_certs(str(first), ["localhost"])
    reloader = CertReloader(str(crt), str(key), period_s=0.0)
    live = reloader.context()
    ca2, crt2, key2 = write_certs(str(tmp_path / "two"), ["localhost"])
    os.replace(crt2, crt)
    os.replace(key2, key)
    later = time.time() + 5
    os.utime(crt, (later, later))
    os.utime(key, (later, later))
    assert reloader.context() is live  # the same context (the server's), now with the new certificate

    import threading

    server_end, client_end = socket.socketpair()
    handshake = threading.Thread(target=lambda: live.wrap_socket(server_end, server_side=True).close())
    handshake.start()
    client = ssl.create_default_context(cafile=str(ca2)).wrap_socket(client_end, server_hostname="localhost")
    client.close()  # the handshake verified the new certificate against the new CA
    handshake.join(10)
    assert ca1 != ca2


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_twenty_stalled_uploads_raise_the_webhook_process_memory_by_under_50_mib(tls, tmp_path):
    """Issue 10's figure on a real `gpupool kube webhook` process: 20 clients each send 4 MB of
    an announced 8 MB body and stall."""
    import threading

    from .conftest import start_webhook_process

    proc, port = start_webhook_process(tls, tmp_path / "webhook.log")
    socks = []
    try:
        sock = _raw(port, tls["ca"])  # one full request first: the server's steady size
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_answers(sock, 1)[0][0] == 200
        sock.close()
        before = _rss_mib(proc.pid)

        def stall() -> None:
            s = _raw(port, tls["ca"])
            socks.append(s)
            try:
                s.sendall(b"POST /mutate HTTP/1.1\r\nContent-Length: 8000000\r\n\r\n" + b" " * 4_000_000)
            except OSError:  # refused (503) and closed: fine
                pass

        threads = [threading.Thread(target=stall) for _ in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        # the server settles after the burst: its RSS back within 50 MiB of its steady size
        wait_until(
            lambda: _rss_mib(proc.pid) - before < 50,
            30,
            "the RSS within 50 MiB of the steady size",
            detail=lambda: f"grown {_rss_mib(proc.pid) - before:.1f} MiB",
        )
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(10)


def test_a_handler_bug_answers_500_with_a_request_id_and_not_its_text(caplog):
    """A bug is logged with its traceback under a request id; the answer names the id, never the exception."""

    def broken(method, path, body):
        raise RuntimeError("secret detail of the bug")

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"{}"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/mutate", "headers": [(b"content-length", b"2")]}
    asyncio.run(WebhookASGI(broken)(scope, receive, send))
    start, body = sent[0], json.loads(sent[1]["body"])
    assert start["status"] == 500 and body["error"]["code"] == "internal"
    assert "secret detail" not in sent[1]["body"].decode()
    request_id = dict(start["headers"])[b"x-request-id"].decode()
    assert body["error"]["request_id"] == request_id
    assert any(request_id in r.getMessage() and r.exc_info for r in caplog.records)
