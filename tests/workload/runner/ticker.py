"""A workload for suspend tests: counts, one JSON line per tick, until a stop file appears.

Usage: python ticker.py LOG STOP_FILE
Each line holds the tick number, the time, the pid and the attempt env; a SIGTERM is logged too
(a suspension must send none). The ticks of one run are continuous: 0, 1, 2, ...
"""

import json
import os
import signal
import sys
import time

log_path, stop = sys.argv[1], sys.argv[2]


def note(event: str, tick: int = -1) -> None:
    line = {
        "event": event,
        "tick": tick,
        "pid": os.getpid(),
        "time": time.time(),
        "attempt": os.environ.get("GPUPOOL_ATTEMPT"),
        "lease": os.environ.get("GPUPOOL_LEASE_ID"),
    }
    with open(log_path, "a") as handle:  # one write per line: lines never interleave
        handle.write(json.dumps(line) + "\n")


def on_term(signum, frame):
    note("sigterm")
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
note("start")
tick = 0
deadline = time.time() + 120
while not os.path.exists(stop) and time.time() < deadline:
    note("tick", tick)
    tick += 1
    time.sleep(0.05)  # the pace of its ticks: progress that a stopped job does not make
note("done", tick)
