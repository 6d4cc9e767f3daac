"""Issue 23 item 4's attack on a real listener process: stalled uploads, header floods and slow
request heads at once, while a bystander measures its own requests and the server's RSS is sampled.

Used by the pool server's and the webhook's memory tests; stdlib only (and gpupool's one percentile),
one thread per attacker.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional

from waiting import wait_until

from gpupool.core.percentile import percentile

MIB = 1024 * 1024
# A stalled connection closed within the cap plus this was closed by the cap's timer (the next
# timer a server has is its default body timeout, 10 s); one still open after the cap plus
# NOT_CLOSED_AFTER_S is not closed at all.
CLOSE_SLACK_S = 6.0
NOT_CLOSED_AFTER_S = 20.0


@dataclass
class Target:
    """Where and how to reach the listener."""

    port: int
    pid: int
    post_path: str  # an endpoint that takes a body
    token: Optional[str] = None
    ca: Optional[str] = None  # TLS with this CA
    host: str = "127.0.0.1"

    def connect(self, timeout_s: float) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
        if self.ca is None:
            return sock
        context = ssl.create_default_context(cafile=self.ca)
        return context.wrap_socket(sock, server_hostname="localhost")

    def head(self, method: str, path: str, extra: str = "") -> bytes:
        auth = f"Authorization: Bearer {self.token}\r\n" if self.token else ""
        return f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}{extra}".encode()


@dataclass
class Report:
    """What the attack measured."""

    rss_before_mib: float = 0.0
    rss_peak_mib: float = 0.0
    rss_after_mib: float = 0.0
    bystander_ms: List[float] = field(default_factory=list)
    bystander_failures: int = 0
    closed_after_s: List[float] = field(default_factory=list)  # stalled uploads and slow heads: send -> server's close
    not_closed: int = 0
    answers: List[str] = field(default_factory=list)  # status lines the stalled connections got
    flood_sent_mib: List[float] = field(default_factory=list)  # what the client got rid of (kernel buffers too)
    floods_cut: int = 0  # floods the server closed before their end
    begun: int = 0  # attackers whose first bytes went out (or that were turned away at the door)
    seconds: float = 0.0

    @property
    def bystander_p99_ms(self) -> float:
        if len(self.bystander_ms) < 2:
            return float("inf")
        return percentile(self.bystander_ms, 99)

    def summary(self) -> str:
        statuses = sorted({a.split(" ")[1] if " " in a else a for a in self.answers})
        return (
            f"RSS {self.rss_before_mib:.1f} -> peak {self.rss_peak_mib:.1f} -> after {self.rss_after_mib:.1f} MiB; "
            f"bystander p99 {self.bystander_p99_ms:.1f} ms (max {max(self.bystander_ms, default=float('nan')):.1f}, "
            f"{self.bystander_failures} failed); stalled closed within {max(self.closed_after_s, default=float('nan')):.2f} s "
            f"({self.not_closed} not closed, answers {statuses}); {self.floods_cut} floods cut after "
            f"{', '.join(f'{m:.2f}' for m in self.flood_sent_mib)} MiB; {self.seconds:.1f} s"
        )


def rss_mib(pid: int) -> float:
    """The resident set of process `pid` (VmRSS), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _wait_closed(sock: socket.socket, sent_at: float, wait_s: float, report: Report, lock: threading.Lock) -> None:
    """Read until the server closes; record when (or that it did not within `wait_s`)."""
    sock.settimeout(wait_s)
    first = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            first = first or data
    except (socket.timeout, TimeoutError):
        with lock:
            report.not_closed += 1
        return
    except OSError:  # reset by the server: closed too
        pass
    with lock:
        report.closed_after_s.append(time.monotonic() - sent_at)
        if first:
            report.answers.append(first.split(b"\r\n", 1)[0].decode("latin-1"))


def stalled_upload(target: Target, length: int, part: int, wait_s: float, report: Report, lock: threading.Lock) -> None:
    """Announce `length` bytes of JSON, send `part` of them, stall until the server closes."""
    try:
        sock = target.connect(wait_s)
    except OSError:
        with lock:
            report.closed_after_s.append(0.0)  # refused at the door: closed too
            report.begun += 1
        return
    with sock:
        head = target.head(
            "POST", target.post_path, f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )
        try:
            sock.sendall(head + b" " * part)
        except OSError:  # answered and closed while sending: closed at once
            pass
        with lock:
            report.begun += 1
        _wait_closed(sock, time.monotonic(), wait_s, report, lock)


def slow_head(target: Target, wait_s: float, report: Report, lock: threading.Lock) -> None:
    """Send half a request head and stall until the server closes."""
    try:
        sock = target.connect(wait_s)
    except OSError:
        with lock:
            report.closed_after_s.append(0.0)
            report.begun += 1
        return
    with sock:
        sock.sendall(target.head("GET", "/healthz", "X-Slow: "))
        with lock:
            report.begun += 1
        _wait_closed(sock, time.monotonic(), wait_s, report, lock)


def header_flood(target: Target, total: int, report: Report, lock: threading.Lock) -> None:
    """Stream one header line of up to `total` bytes; stop when the server closes."""
    chunk = b"a" * 65536
    sent = 0
    cut = False
    try:
        with target.connect(10.0) as sock:
            sock.sendall(target.head("GET", "/healthz", "X-Flood: "))
            with lock:
                report.begun += 1
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
    except (socket.timeout, TimeoutError):  # the server stopped reading but kept the connection: not cut
        pass
    except OSError:  # reset or closed by the server
        cut = sent < total
    with lock:
        report.flood_sent_mib.append(sent / MIB)
        report.floods_cut += cut


def bystander(target: Target, count: int, report: Report) -> None:
    """`count` GET /healthz on a keep-alive connection (a new one when the server closes it), timed."""
    request = target.head("GET", "/healthz", "\r\n")
    sock: Optional[socket.socket] = None
    for _ in range(count):
        started = time.perf_counter()
        try:
            if sock is None:
                sock = target.connect(5.0)
            sock.sendall(request)
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("closed")
                answer += data
            if not answer.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(answer[:60].decode("latin-1"))
            report.bystander_ms.append((time.perf_counter() - started) * 1000)
        except OSError:
            report.bystander_failures += 1
            if sock is not None:
                sock.close()
            sock = None
        time.sleep(0.01)  # a bystander's pace: a client among others, not one more flood
    if sock is not None:
        sock.close()


def attack(
    target: Target,
    cap_s: float,
    uploads: int = 200,
    upload_length: int = 1_000_000,
    upload_part: int = 256 * 1024,
    floods: int = 4,
    flood_bytes: int = 64 * MIB,
    slow_heads: int = 20,
    settle_s: float = 15.0,
) -> Report:
    """All attackers at once, a bystander during them, RSS sampled throughout and after.

    `cap_s` is the server's body and head time cap: a stalled connection not closed
    within cap_s + NOT_CLOSED_AFTER_S counts as not closed.
    """
    report = Report()
    lock = threading.Lock()
    bystander(target, 5, Report())  # the server's steady size: it has served a request (TLS set up ...)
    report.rss_before_mib = report.rss_peak_mib = rss_mib(target.pid)
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(0.02):
            report.rss_peak_mib = max(report.rss_peak_mib, rss_mib(target.pid))

    started = time.monotonic()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    wait_s = cap_s + NOT_CLOSED_AFTER_S
    threads = [
        threading.Thread(target=stalled_upload, args=(target, upload_length, upload_part, wait_s, report, lock))
        for _ in range(uploads)
    ]
    threads += [threading.Thread(target=header_flood, args=(target, flood_bytes, report, lock)) for _ in range(floods)]
    threads += [threading.Thread(target=slow_head, args=(target, wait_s, report, lock)) for _ in range(slow_heads)]
    for t in threads:
        t.daemon = True
        t.start()
    # the attack under way: each attacker has sent its first bytes, been turned away, or ended
    wait_until(
        lambda: report.begun + sum(not t.is_alive() for t in threads) >= len(threads), 60, "every attacker under way"
    )
    bystander(target, 100, report)
    for t in threads:
        t.join(wait_s + 5)
    stop_sampling.set()
    sampler.join()

    # Memory comes back once they are gone: poll for it (RSS settles as the allocator frees).
    def settled() -> bool:
        report.rss_after_mib = rss_mib(target.pid)
        return report.rss_after_mib - report.rss_before_mib <= 20

    try:
        wait_until(settled, settle_s, "the server's RSS back within 20 MiB", interval=0.25)
    except AssertionError:
        pass  # not asserted here: assert_bounded says by how much it stayed up
    report.seconds = time.monotonic() - started
    return report


def assert_bounded(report: Report, cap_s: float) -> None:
    """Issue 23: RSS +50 MiB at most and back within 20 MiB, another client served all along,
    every stalled connection closed by the cap, every flood cut off.

    The times are bounded only as far as a loaded machine cannot break them: the bystander's p99
    under the cap (it was served during the attack, not once the attackers were cut; issue 23's
    figure is 50 ms, printed in the summary), each stalled connection closed within the cap plus
    CLOSE_SLACK_S (by the cap's timer, not a later one; issue 23's figure is 1.5 s)."""
    summary = report.summary()
    assert report.rss_peak_mib - report.rss_before_mib <= 50, summary
    assert report.bystander_failures == 0 and report.bystander_p99_ms < cap_s * 1000, summary
    assert report.not_closed == 0 and max(report.closed_after_s) <= cap_s + CLOSE_SLACK_S, summary
    assert report.floods_cut == len(report.flood_sent_mib), summary
    assert report.rss_after_mib - report.rss_before_mib <= 20, summary
