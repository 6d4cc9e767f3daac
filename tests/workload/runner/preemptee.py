"""A workload for preemption tests: logs each start (pid, attempt env) and each SIGTERM as JSON
lines, and holds until a stop file appears.

Usage: python preemptee.py LOG STOP_FILE [ignore-term]
With ignore-term it logs SIGTERM and runs on (only SIGKILL ends it); otherwise it exits 143.
"""

import json
import os
import signal
import sys
import time

log_path, stop = sys.argv[1], sys.argv[2]
ignore_term = len(sys.argv) > 3 and sys.argv[3] == "ignore-term"


def note(event: str) -> None:
    line = {
        "event": event,
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
        "time": time.time(),
        "attempt": os.environ.get("GPUPOOL_ATTEMPT"),
        "preempted": os.environ.get("GPUPOOL_PREEMPTED"),
        "lease": os.environ.get("GPUPOOL_LEASE_ID"),
    }
    with open(log_path, "a") as handle:  # one write per line: lines never interleave
        handle.write(json.dumps(line) + "\n")


def on_term(signum, frame):
    note("sigterm")
    if not ignore_term:
        sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
note("start")
deadline = time.time() + 120
while not os.path.exists(stop) and time.time() < deadline:
    time.sleep(0.02)
note("done")
