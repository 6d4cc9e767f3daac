"""A workload for runner tests that leaves a tree behind: a grandchild and a setsid'd daemon.

Usage: python spawner.py RECORD_FILE [STOP_FILE]
Writes {"pid", "grandchild", "daemon"} to RECORD_FILE, then holds until STOP_FILE exists (60 s at most).
"""

import json
import os
import subprocess
import sys
import time

record, stop = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
grandchild = subprocess.Popen(["sleep", "1000"])
# The classic daemon: fork, setsid (out of the process group and session), fork again, exit the
# middle one, so the daemon is re-parented away from this process.
read_end, write_end = os.pipe()
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(write_end, str(os.getpid()).encode())
        os.execvp("sleep", ["sleep", "1001"])
    os._exit(0)
os.close(write_end)
os.waitpid(middle, 0)
daemon = int(os.read(read_end, 32))
tmp = record + ".tmp"
with open(tmp, "w") as handle:
    json.dump({"pid": os.getpid(), "grandchild": grandchild.pid, "daemon": daemon}, handle)
os.replace(tmp, record)
deadline = time.time() + 60
while not (stop and os.path.exists(stop)) and time.time() < deadline:
    time.sleep(0.02)
