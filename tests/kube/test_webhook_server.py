"""The webhook's HTTP server: keep-alive, pipelining, malformed requests, certificate rotation."""

from __future__ import annotations

import json
import os
import socket
import ssl
import time

from gpupool.kube.admission import CertReloader
from gpupool.kube.certs import write_certs


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
            answers.append((int(head.split(b" ")[1]), head, json.loads(rest[:length])))
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
        assert b"Connection: close" in answers[0][1]
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
