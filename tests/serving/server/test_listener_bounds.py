"""Issue 23 item 4 on a real `gpupool server`: bounded memory against strangers and token holders."""

from __future__ import annotations

import socket

import pytest
from http_attack import CLOSE_SLACK_S, Target, assert_bounded, attack, rss_mib

from gpupool.serving.server.listener import BODY_TIMEOUT_ENV, HEAD_TIMEOUT_ENV, MAX_HEADER_BYTES

CAP_S = 2.0  # the body and head time caps of the servers under attack


@pytest.fixture
def short_caps(monkeypatch):
    monkeypatch.setenv(HEAD_TIMEOUT_ENV, str(CAP_S))
    monkeypatch.setenv(BODY_TIMEOUT_ENV, str(CAP_S))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_stalled_uploads_and_header_floods_leave_the_pool_server_bounded(server_factory, short_caps):
    """200 stalled near-1 MiB uploads with a token, 4 x 64 MiB header floods and 20 slow heads at once."""
    server = server_factory()
    target = Target(_port(server.url), server.proc.pid, "/v1/leases", token=server.token)
    report = attack(target, CAP_S)
    print(report.summary())
    assert_bounded(report, CAP_S)
    assert server.proc.poll() is None


def _exchange(port: int, request: bytes) -> bytes:
    """Send `request`, read until the server closes (or 60 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request)
        answer = b""
        while True:
            data = sock.recv(65536)
            if not data:
                return answer
            answer += data


def test_oversize_head_is_431_and_closed_oversize_body_is_413(server_factory):
    server = server_factory()
    port = _port(server.url)
    head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * (MAX_HEADER_BYTES + 1) + b"\r\n\r\n"
    answer = _exchange(port, head)  # returns only once the server closed
    assert answer.startswith(b"HTTP/1.1 431") and b'"too_large"' in answer, answer[:200]
    auth = f"Authorization: Bearer {server.token}\r\n".encode()
    body = b"POST /v1/leases HTTP/1.1\r\nHost: localhost\r\n" + auth + b"Content-Length: 2000000\r\n\r\n"
    answer = _exchange(port, body)
    assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer, answer[:200]
    assert b'"code":"too_large"' in answer and b"2000000" in answer


def test_a_stalled_body_gets_408_within_the_cap_even_with_a_token(server_factory, short_caps):
    import time

    server = server_factory()
    auth = f"Authorization: Bearer {server.token}\r\n".encode()
    started = time.monotonic()
    answer = _exchange(
        _port(server.url),
        b"POST /v1/leases HTTP/1.1\r\nHost: localhost\r\n" + auth + b"Content-Length: 100\r\n\r\n{",
    )
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":"timeout"' in answer, answer[:200]
    assert CAP_S - 0.1 <= time.monotonic() - started <= CAP_S + CLOSE_SLACK_S  # by the cap, not a later timer


def test_an_idle_or_half_sent_head_is_closed_within_the_cap(server_factory, short_caps):
    import time

    server = server_factory()
    for request in (b"", b"GET /healthz HTTP/1.1\r\nHost: local"):
        started = time.monotonic()
        assert _exchange(_port(server.url), request) == b""
        assert time.monotonic() - started <= CAP_S + CLOSE_SLACK_S  # by the cap, not the 30 s default
    assert rss_mib(server.proc.pid) > 0  # still serving
