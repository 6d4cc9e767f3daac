"""Pool benchmark: claim+release over HTTP at 1, 16 and 64 clients, and in-process placement at scale.

HTTP: a `gpupool server` subprocess on loopback with 8 emulated 16 GiB GPUs
and auth on, run twice: with the fast path (the default server, "http") and
with FastAPI's routes alone (GPUPOOL_FAST_PATH=0, "http_plain"); see
server/fastpath.py. N closed-loop clients, each on its own keep-alive connection,
looping claim(1 GPU, 10 %) -> wait for the answer -> release -> wait. The
clients are spread over --client-procs processes, each driving its share
of the connections from one epoll loop with prebuilt request bytes, so the
load generator costs little of the machine's CPU (the server shares it).
Placement: `place()` on 1,000 devices with 10,000 live leases, and a full
in-process Pool.claim + release with those leases in the SQLite store.

Writes benchmarks/results/pool.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import serverproc  # beside this script

from gpupool.core.percentile import percentile

ROOT = Path(__file__).resolve().parent
CLAIM = json.dumps(
    {"claim": {"requests": [{"count": 1, "fraction": 0.1}]}, "holder": {"pid": 1, "host": "bench"}, "ttl_s": 60}
).encode()


def start_server(state: Path, fast_path: bool = True) -> Tuple[subprocess.Popen, str, str]:
    """A `gpupool server` subprocess on state dir `state`: (process, host:port, admin token)."""
    state.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GPUPOOL_FAST_PATH="1" if fast_path else "0")
    token_file = state / "token"
    proc, url = serverproc.start_server(state / "pool", token_file, state / "server.log", "emulated:8x16GiB", env)
    return proc, url.split("://", 1)[1], token_file.read_text().strip()


def _client_process(addr: str, token: str, conns: int, start_at: float, seconds: float, warmup: float, queue) -> None:
    """`conns` closed-loop clients in one process: one keep-alive socket each, driven by one epoll loop.

    Each client sends claim, waits for the whole answer, sends release, waits, and
    starts over: the load shape of `conns` blocking clients, without a thread (and
    GIL hand-offs) per client. Requests are prebuilt bytes; answers are parsed just
    enough to find the end of the body and the lease id.
    """
    import selectors
    import socket

    host, port = addr.split(":")
    auth = f"Authorization: Bearer {token}\r\n".encode()
    claim_req = (
        b"POST /v1/leases HTTP/1.1\r\nHost: "
        + host.encode()
        + b"\r\n"
        + auth
        + b"Content-Type: application/json\r\nContent-Length: "
        + str(len(CLAIM)).encode()
        + b"\r\n\r\n"
        + CLAIM
    )
    release_head = b"DELETE /v1/leases/"
    release_tail = b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\n" + auth + b"Content-Length: 0\r\n\r\n"

    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(conns):
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        socks.append(s)
    while time.time() < start_at:
        time.sleep(0.001)
    perf = time.perf_counter
    offset = perf() - time.time()
    warm_until = start_at + warmup + offset
    stop_at = start_at + warmup + seconds + offset
    rounds: List[float] = []
    claims: List[float] = []
    failures = 0
    # per socket: [phase (0 claim, 1 release), t0, t1, buffer]
    state = {}
    for s in socks:
        t = perf()
        s.sendall(claim_req)
        state[s.fileno()] = [s, 0, t, 0.0, b""]
        sel.register(s, selectors.EVENT_READ, s.fileno())
    active = len(socks)
    while active:
        for key, _ in sel.select():
            st = state[key.data]
            s = st[0]
            data = s.recv(65536)
            if not data:
                raise SystemExit("server closed a connection")
            buf = st[4] + data
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                st[4] = buf
                continue
            head = buf[:head_end].lower()
            clen_at = head.find(b"content-length:")
            clen = int(head[clen_at + 15 : head.find(b"\r\n", clen_at) if head.find(b"\r\n", clen_at) > 0 else None])
            end = head_end + 4 + clen
            if len(buf) < end:
                st[4] = buf
                continue
            st[4] = b""
            now = perf()
            status = buf[9:12]
            if st[1] == 0:
                if status != b"201":
                    failures += 1
                    if now >= stop_at:
                        sel.unregister(s)
                        active -= 1
                        continue
                    st[2] = perf()
                    s.sendall(claim_req)
                    continue
                body = buf[head_end + 4 : end]
                i = body.find(b'"id":"') + 6
                lease_id = body[i : body.find(b'"', i)]
                st[1], st[3] = 1, now
                s.sendall(release_head + lease_id + release_tail)
            else:
                if status != b"200":
                    failures += 1
                t0 = st[2]
                if t0 >= warm_until:
                    rounds.append(now - t0)
                    claims.append(st[3] - t0)
                if now >= stop_at:
                    sel.unregister(s)
                    active -= 1
                    continue
                st[1], st[2] = 0, perf()
                s.sendall(claim_req)
    for s in socks:
        s.close()
    cpu = os.times()
    queue.put([(rounds, claims, failures, cpu.user + cpu.system)])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def run_level(
    addr: str, token: str, clients: int, seconds: float, warmup: float, server_pid: int, client_procs: int
) -> Dict[str, float]:
    procs_n = min(clients, client_procs)
    per = [clients // procs_n + (1 if i < clients % procs_n else 0) for i in range(procs_n)]
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    start_at = time.time() + 0.5
    procs = [ctx.Process(target=_client_process, args=(addr, token, n, start_at, seconds, warmup, queue)) for n in per]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at + warmup - time.time()))
    cpu_before = _cpu_s(server_pid)
    results = [r for _ in procs for r in queue.get()]
    cpu_used = _cpu_s(server_pid) - cpu_before
    for p in procs:
        p.join()
    rounds = sorted(x for r, _, _, _ in results for x in r)
    claims = sorted(x for _, c, _, _ in results for x in c)
    failures = sum(f for _, _, f, _ in results)
    client_cpu = sum(c for _, _, _, c in results)

    def pct(values: List[float], q: float) -> float:
        return round(percentile(values, q * 100) * 1000, 3)

    return {
        "clients": clients,
        "claim_release_per_s": round(len(rounds) / seconds, 1),
        "round_trip_p50_ms": pct(rounds, 0.50),
        "round_trip_p99_ms": pct(rounds, 0.99),
        "claim_p50_ms": pct(claims, 0.50),
        "claim_p99_ms": pct(claims, 0.99),
        "failures": failures,
        # server CPU per HTTP request (2 per round trip): what the server costs, whatever else runs
        "server_cpu_ms_per_request": round(cpu_used / max(1, 2 * len(rounds)) * 1000, 3),
        # all client processes together, warm-up included: the load generator's share of the CPUs
        "client_cpu_cores": round(client_cpu / (warmup + seconds), 2),
    }


def bench_placement(devices_n: int = 1000, leases_n: int = 10000) -> Dict[str, float]:
    """`place()` alone, and Pool.claim + release, with `leases_n` live leases on `devices_n` GPUs."""
    from gpupool.core.model import Claim, Holder, Lease, Slice, allocated_by_device
    from gpupool.core.placement import place
    from gpupool.pooling.devices import emulated_devices
    from gpupool.pooling.pool import Pool

    devices = emulated_devices(f"emulated:{devices_n}x80GiB", "bench")
    rng = random.Random(1)
    now = time.time()
    leases = []
    for i in range(leases_n):
        d = devices[rng.randrange(devices_n)]
        leases.append(Lease(f"l{i:06d}", Holder("bench"), (Slice(d.uuid, 512, 0),), 3600.0, now, now + 3600))
    allocated = allocated_by_device(leases)
    claim = Claim.single(2, fraction=0.25)
    t = time.perf_counter()
    n = 200
    for _ in range(n):
        assert place(devices, allocated, claim).fits
    place_ms = (time.perf_counter() - t) / n * 1000

    with tempfile.TemporaryDirectory() as tmp:
        pool = Pool(tmp, devices=devices, node="bench")
        with pool.store.write() as tx:
            for lease in leases:
                tx.insert_lease(lease)
        times = []
        for _ in range(100):
            t0 = time.perf_counter()
            granted = pool.claim(claim, Holder("bench"))
            pool.release(granted.id)
            times.append(time.perf_counter() - t0)
        pool.close()
    times.sort()
    return {
        "devices": devices_n,
        "live_leases": leases_n,
        "place_ms": round(place_ms, 3),
        "pool_claim_release_p50_ms": round(statistics.median(times) * 1000, 3),
        "pool_claim_release_p99_ms": round(percentile(times, 99) * 1000, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per level")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--levels", default="1,16,64")
    parser.add_argument("--client-procs", type=int, default=2, help="client processes (connections spread over them)")
    parser.add_argument(
        "--fast-path",
        choices=("both", "on", "off"),
        default="both",
        help="server variants to measure: with the fast path (http), without (http_plain)",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "pool.json"))
    args = parser.parse_args()

    load_at_start = os.getloadavg()
    variants = {"both": (True, False), "on": (True,), "off": (False,)}[args.fast_path]
    http_by_variant: Dict[str, List[Dict[str, float]]] = {}
    for fast_path in variants:
        key = "http" if fast_path else "http_plain"
        http_by_variant[key] = []
        with tempfile.TemporaryDirectory() as tmp:
            proc, addr, token = start_server(Path(tmp), fast_path)
            try:
                for clients in [int(x) for x in args.levels.split(",")]:
                    level = run_level(addr, token, clients, args.seconds, args.warmup, proc.pid, args.client_procs)
                    http_by_variant[key].append(level)
                    print(json.dumps(dict(level, variant=key)), file=sys.stderr, flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(10)
    placement = bench_placement()
    try:
        import importlib.util

        import uvicorn  # noqa: F401

        stack = {
            "httptools": importlib.util.find_spec("httptools") is not None,
            "uvloop": importlib.util.find_spec("uvloop") is not None,
        }
    except ImportError:  # pragma: no cover
        stack = {}
    figures = {
        "load_average_at_start": [round(x, 2) for x in load_at_start],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "machine": {
            "cpus": os.cpu_count(),
            "note": "server, clients and whatever else runs on the machine share these CPUs",
            "python": platform.python_version(),
            "platform": platform.platform(),
            **stack,
        },
        "server": "gpupool server subprocess: uvicorn (httptools, uvloop), FastAPI routers with an auth dependency; "
        "http: with the fast path ASGI layer for claim/heartbeat/release (the default), http_plain: "
        "GPUPOOL_FAST_PATH=0; SQLite WAL synchronous=NORMAL, background checkpoints, auth on, "
        "8 emulated 16 GiB GPUs",
        "clients": f"closed loop, one keep-alive connection each, claim(1 GPU, 10 %) then release; spread over "
        f"{args.client_procs} processes with one epoll loop each; {args.seconds:g} s measured per level "
        f"after {args.warmup:g} s warm-up",
        **http_by_variant,
        "placement": placement,
        "target": "claim+release >= 1000/s and round-trip p99 < 10 ms at 16 clients",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
