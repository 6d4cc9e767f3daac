"""Memory caps that fail closed, on a real GPU: many starts of a job that asks past its share.

Each start is `gpupool run -p SHARE --wait S --isolation mps -- python -m gpupool.bench.isolation.alloc`,
several at a time, on the rounds' MPS state dir, while a disturber kills the pool's MPS control
daemon and servers with SIGKILL every few seconds (the next start brings the daemon back). A start
ran over its cap when its allocation past the share succeeded; every other start was held: the
driver refused the allocation (the MPS memory limit), or the start was stopped or refused before
it, for the reason its exit code and last line give.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.isolation_mode import IsolationMode
from ...pooling.isolation.mps import mps_dirs

if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    from .rounds import Settings

START_TIMEOUT_S = 180.0
# The control daemon writes its pid here (NVIDIA's MPS documentation).
MPS_PID_FILE = "nvidia-cuda-mps-control.pid"
MPS_PROCESS_NAMES = ("nvidia-cuda-mps", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def _mps_pids(pipe_dir: Path) -> List[int]:
    """The pool's MPS control daemon (its pid file) and every MPS server process on the machine."""
    pids = []
    try:
        pids.append(int((pipe_dir / MPS_PID_FILE).read_text().strip()))
    except (OSError, ValueError):
        pass
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in MPS_PROCESS_NAMES or comm.startswith("nvidia-cuda-mps"):
                pids.append(int(entry.name))
    return sorted(set(pids))


class Disturber(threading.Thread):
    """Kills the MPS daemon and servers every `every_s` seconds until stopped; keeps the kill times."""

    def __init__(self, pipe_dir: Path, every_s: float) -> None:
        super().__init__(daemon=True)
        self.pipe_dir = pipe_dir
        self.every_s = every_s
        self.kills: List[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            pids = _mps_pids(self.pipe_dir)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if pids:
                self.kills.append(time.monotonic())


def _one(settings: Settings, index: int, share: float, times: float) -> Dict[str, Any]:
    out = settings.out / "caps" / f"start-{index}.json"
    command = [
        settings.python, "-m", "gpupool", "run", "-n", "1", "-p", f"{share:g}", "--isolation", "mps",
        "--ttl", f"{settings.ttl_s:g}", "--wait", f"{START_TIMEOUT_S / 2:g}", "-q", "--",
        settings.python, "-m", "gpupool.bench.isolation.alloc", "--times", f"{times:g}", "--out", str(out),
    ]  # fmt: skip
    env = dict(os.environ, GPUPOOL_STATE=str(settings.state_dir(IsolationMode.MPS)))
    began = time.monotonic()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        code, text = done.returncode, (done.stderr or done.stdout).strip()
    except subprocess.TimeoutExpired:
        code, text = None, f"no end in {START_TIMEOUT_S:g} s"
    ended = time.monotonic()
    result: Optional[Dict[str, Any]] = None
    try:
        result = json.loads(out.read_text())
    except (OSError, ValueError):
        pass
    return {
        "index": index,
        "began": began,
        "ended": ended,
        "exit": code,
        "result": result,
        "last_line": text.splitlines()[-1] if text else "",
    }


def outcome(start: Dict[str, Any]) -> Tuple[str, str]:
    """('over' | 'capped' | 'stopped', reason) for one start's record."""
    result = start.get("result")
    if result is not None:
        if result.get("over"):
            return "over", f"allocated {result.get('asked_mib')} MiB on a {result.get('share_mib')} MiB share"
        if result.get("stage") == "cuMemAlloc" and result.get("cuda_error"):
            return "capped", f"the driver refused the allocation (CUresult {result['cuda_error']})"
        if result.get("stage") != "cuMemAlloc":
            return "stopped", f"{result.get('stage')} failed (CUresult {result.get('cuda_error')})"
        return "stopped", "allocation past a missing share"
    return "stopped", f"gpupool run exited {start.get('exit')}: {start.get('last_line', '')[:160]}"


def summarize(starts: List[Dict[str, Any]], kills: List[float]) -> Dict[str, Any]:
    """Counts of over / capped / stopped (with reasons), and how many starts a daemon kill hit."""
    counts: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    during = 0
    for start in starts:
        kind, reason = outcome(start)
        counts[kind] += 1
        reasons[f"{kind}: {reason}"] += 1
        if any(start["began"] <= k <= start["ended"] for k in kills):
            during += 1
    origin = min((s["began"] for s in starts), default=0.0)
    over = [s for s in starts if outcome(s)[0] == "over"]
    return {
        "starts": len(starts),
        "ran_over_cap": counts["over"],
        "capped_by_the_driver": counts["capped"],
        "stopped_or_refused": counts["stopped"],
        "starts_during_a_daemon_kill": during,
        "daemon_kills": len(kills),
        "reasons": dict(reasons.most_common()),
        # When each over-cap start ran and when the daemon was killed (s from the first start): are they near?
        "over_cap_starts_s": [[round(s["began"] - origin, 2), round(s["ended"] - origin, 2)] for s in over],
        "daemon_kills_s": [round(k - origin, 2) for k in kills],
    }


def run_caps(
    settings: Settings, starts: int, concurrent: int, share: float, times: float, kill_every_s: float, limit_s: float
) -> Dict[str, Any]:
    """`starts` over-allocating starts, `concurrent` at a time, the MPS daemon killed every `kill_every_s`;
    no start begins after `limit_s` (a GPU lease is short), and the report counts those that ran."""
    (settings.out / "caps").mkdir(parents=True, exist_ok=True)
    pipe_dir, _ = mps_dirs(settings.state_dir(IsolationMode.MPS))
    disturber = Disturber(pipe_dir, kill_every_s)
    began = time.monotonic()
    if kill_every_s > 0:
        disturber.start()
    try:
        with ThreadPoolExecutor(max_workers=concurrent) as pool:
            deadline = began + limit_s
            done = pool.map(
                lambda i: _one(settings, i, share, times) if time.monotonic() < deadline else None, range(starts)
            )
            records = [r for r in done if r is not None]
    finally:
        disturber.done.set()
    summary = summarize(records, disturber.kills)
    settings.progress(
        f"caps: {summary['starts']} starts, {summary['ran_over_cap']} over their cap, "
        f"{summary['capped_by_the_driver']} capped by the driver, {summary['stopped_or_refused']} stopped"
    )
    return dict(
        summary,
        share=share,
        asked_times_share=times,
        asked_starts=starts,
        concurrent=concurrent,
        kill_every_s=kill_every_s,
        seconds=round(time.monotonic() - began, 1),
    )
