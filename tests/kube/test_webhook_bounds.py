"""Issue 23 item 4 on a real `gpupool kube webhook` process (TLS): the same attack as the pool server's."""

from __future__ import annotations

import time

from http_attack import Target, assert_bounded, attack

from gpupool.serving.server.listener import BODY_TIMEOUT_ENV, HEAD_TIMEOUT_ENV

from .conftest import start_webhook_process

CAP_S = 2.0


def test_stalled_uploads_and_header_floods_leave_the_webhook_bounded(tls, tmp_path, monkeypatch):
    monkeypatch.setenv(HEAD_TIMEOUT_ENV, str(CAP_S))
    monkeypatch.setenv(BODY_TIMEOUT_ENV, str(CAP_S))
    proc, port = start_webhook_process(tls, tmp_path / "webhook.log")
    try:
        report = attack(Target(port, proc.pid, "/mutate", ca=tls["ca"]), CAP_S)
        print(report.summary())
        assert_bounded(report, CAP_S)
        assert proc.poll() is None
    finally:
        proc.kill()  # kill -9: the webhook leaves nothing behind to clean
        proc.wait(10)


def test_a_body_slower_than_the_head_timer_is_served_within_the_body_cap(tls):
    """The head timer stops once a head is complete (over TLS, where the ASGI layer finds its connection)."""
    import socket
    import ssl

    from gpupool.kube.webserver import Limits, WebServer

    server = WebServer(
        ("127.0.0.1", 0),
        lambda m, p, b: (200, {"got": len(b)}),
        lambda: _context(tls),
        Limits(body_timeout_s=60.0),
        0.5,
    ).start()
    try:
        raw = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        with ssl.create_default_context(cafile=tls["ca"]).wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
            time.sleep(1.5)  # the client stalls mid-body past three head timers (0.5 s): what is tested
            sock.sendall(b"67890")
            assert sock.recv(1000).startswith(b"HTTP/1.1 200")
    finally:
        server.shutdown()


def _context(tls):
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tls["crt"], tls["key"])
    return ctx
