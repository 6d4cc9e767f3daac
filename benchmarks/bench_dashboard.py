"""The web dashboard and /metrics of a big pool: 1,000 GPUs (125 nodes x 8) holding 10,000 leases.

A real pool (SQLite state dir) is filled directly through the store: 10,000 leases of
1.6 GiB each (a third of them held by pods, with namespace/pod labels), one process per
lease in the usage record (as the watchdog writes it), 20 enforcement actions and a
history hour. Then, each --rounds times:

- the server side of `/`: pool status, view, HTML (`page`, from the Jinja2 templates, and
  `live`), and the whole GET through the app (auth, gzip) over a real uvicorn socket,
  reading the status afresh;
- `/ui/live`, what the page fetches on every refresh, afresh and with the status read shared
  by the viewers of the last second (the default);
- `/metrics` (every per-lease series included);
- in headless Chromium (when /usr/bin/chromium and selenium are here): time to load the
  page (navigation start to the load event) and to swap in one refresh.

    python benchmarks/bench_dashboard.py [--gpus 1000] [--leases 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

import httpx

from gpupool.core.model import Device, Holder, Lease, Slice
from gpupool.core.usage import DeviceUsage, EnforcementAction, EnforceMode, ProcessUsage, UsageReport, Violation
from gpupool.pooling.pool import Pool
from gpupool.serving.server.app import create_app
from gpupool.serving.server.dashboard import build
from gpupool.serving.server.dashboard import render as draw
from gpupool.serving.server.dashboard.history import History

GPU_MIB = 16384


def fill(pool: Pool, gpus: int, leases: int) -> None:
    """`gpus` devices on nodes of 8 and `leases` leases spread over them, with their usage."""
    now = time.time()
    devices = [
        Device(f"GPU-{i:05d}", i % 8, "NVIDIA A100-SXM4-16GB", GPU_MIB, f"node-{i // 8:03d}") for i in range(gpus)
    ]
    per_gpu = max(1, leases // gpus)
    share = GPU_MIB // (per_gpu + 1)
    rows: List[Lease] = []
    processes: List[ProcessUsage] = []
    for i in range(leases):
        device = devices[i % gpus]
        if i % 3 == 0:
            holder = Holder(f"team-{i % 7}", 1, device.node, f"pod:team-{i % 7}/train-{i}:uid-{i:08d}")
        else:
            holder = Holder(f"user{i % 50}", 10000 + i, device.node)
        # an hour to live: a run on a busy machine takes minutes, and no lease may expire while it is measured
        lease = Lease(f"{i:016x}", holder, (Slice(device.uuid, share),), 3600.0, now - i, now + 3600.0 + i)
        rows.append(lease)
        processes.append(ProcessUsage(20000 + i, device.uuid, share * (i % 5) // 4, 0.3, lease.id))
    with pool.store.write() as tx:
        tx.replace_devices(devices)
        for lease in rows:
            tx.insert_lease(lease)
    actions = tuple(
        EnforcementAction(
            now - 60 + i,
            Violation.OVER_SHARE,
            EnforceMode.KILL,
            20000 + i,
            devices[i].uuid,
            share,
            f"{i:016x}",
            "user1",
        )
        for i in range(20)
    )
    used: Dict[str, int] = {}
    for p in processes:
        used[p.device_uuid] = used.get(p.device_uuid, 0) + p.memory_mib
    pool.record_usage(
        UsageReport(
            now,
            tuple(DeviceUsage(d.uuid, used.get(d.uuid, 0), 0.5) for d in devices),
            tuple(processes),
            actions,
            {"over_share": 20, "unleased": 0},
        )
    )


def timed(fn: Any, rounds: int) -> Dict[str, float]:
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        took.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": round(statistics.median(took), 1), "max_ms": round(max(took), 1)}


def serve(app: Any) -> Any:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(200):
        try:
            httpx.get(url + "/healthz", timeout=1)
            return server, thread, url
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("uvicorn did not start")


def browser(url: str) -> Optional[Dict[str, Any]]:
    """Load and refresh times in headless Chromium, or None when it is not installed."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not chromium or not driver_path:
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        loads = []
        for _ in range(3):
            driver.get(url + "/")
            loads.append(
                driver.execute_script(
                    "const t = performance.getEntriesByType('navigation')[0]; return [t.domContentLoadedEventEnd, t.loadEventEnd];"
                )
            )
        refresh_ms = driver.execute_async_script(
            """const done = arguments[arguments.length - 1];
            const t0 = performance.now();
            fetch('/ui/live', {credentials: 'same-origin'}).then(r => r.text()).then(html => {
              document.getElementById('live').innerHTML = html;
              requestAnimationFrame(() => setTimeout(() => done(performance.now() - t0), 0));
            });"""
        )
        return {
            "dom_content_loaded_ms": round(statistics.median(x[0] for x in loads), 1),
            "load_event_ms": round(statistics.median(x[1] for x in loads), 1),
            "refresh_fetch_and_swap_ms": round(refresh_ms, 1),
            "chromium": driver.capabilities.get("browserVersion", ""),
        }
    finally:
        driver.quit()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--leases", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "dashboard.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        pool = Pool(state, devices=[Device("GPU-seed", 0, "seed", 1)], background_checkpoint=True)
        fill(pool, args.gpus, args.leases)
        history = History()
        start = time.time() - 3600
        status = pool.status()
        for k in range(361):
            history.record(status, start + 10 * k)
        now = time.time()
        points = history.points(now)
        view = build(status, now)
        html = draw.page(view, points, auth=False)
        figures: Dict[str, Any] = {
            "pool_status": timed(pool.status, args.rounds),
            "view_build": timed(lambda: build(status, now), args.rounds),
            "html_page": timed(lambda: draw.page(view, points, auth=False), args.rounds),
            "html_live": timed(lambda: draw.live(view, points), args.rounds),
            "html_bytes": len(html.encode()),
            "html_gzip_bytes": len(gzip.compress(html.encode(), 5)),
        }
        app = create_app(pool, None)
        app.state.dashboard.history = history
        server, thread, url = serve(app)
        gz = {"accept-encoding": "gzip"}
        with httpx.Client(timeout=60) as client:
            # every request reads the pool's status afresh (one viewer, refreshing slower than 1 s) ...
            app.state.dashboard.status_max_age_s = 0.0
            figures["http_get_page"] = timed(lambda: client.get(url + "/", headers=gz).raise_for_status(), args.rounds)
            figures["http_get_live"] = timed(
                lambda: client.get(url + "/ui/live", headers=gz).raise_for_status(), args.rounds
            )
            # ... or shares the last second's read with the other viewers (the default)
            app.state.dashboard.status_max_age_s = 1.0
            client.get(url + "/ui/live", headers=gz)
            figures["http_get_live_shared_status"] = timed(
                lambda: client.get(url + "/ui/live", headers=gz).raise_for_status(), args.rounds
            )
            figures["http_get_metrics"] = timed(lambda: client.get(url + "/metrics").raise_for_status(), args.rounds)
            figures["metrics_bytes"] = len(client.get(url + "/metrics").content)
        if not args.no_browser:
            figures["browser"] = browser(url)
        server.should_exit = True
        thread.join(30)  # the app's shutdown waits for its reads before the pool closes under it
        pool.close()

    results = {
        "benchmark": "dashboard",
        "gpus": args.gpus,
        "leases": args.leases,
        "rounds": args.rounds,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
        **figures,
    }
    print(json.dumps(results, indent=2))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
