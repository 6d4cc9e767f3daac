"""A workload for runner tests that escapes by forking (issue 34, item 3): it daemonises at once
(fork, setsid, fork) and then forks a successor every HOP_S, each process exiting right after its
fork, so no pid lives long enough to be listed and signalled.

Usage: python hopper.py MARK_FILE SECONDS
Every STAMP_S it rewrites MARK_FILE with "PID COUNT" (COUNT grows with every hop): while the file
changes, the hopper lives. It stops by itself after SECONDS, or once MARK_FILE.stop exists (how a
test cleans up one that escaped: its pids cannot be listed in time). MARK_FILE is in its command
line, where a test looks for it.
"""

import os
import sys
import time

HOP_S = 0.0005
STAMP_S = 0.01

mark_file, lifetime_s = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + lifetime_s
# Daemonise: the first process exits (its parent, the command, sees it end at once), the second
# leaves the session and process group, the third is re-parented away from both.
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
# As a daemon does: nothing of the command's stdio is held (whoever reads the runner's output
# sees its end when the runner ends, not when the hopper does).
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
count, stamped = 0, 0.0
while time.monotonic() < deadline:
    now = time.monotonic()
    if now - stamped >= STAMP_S:
        if os.path.exists(f"{mark_file}.stop"):
            break
        tmp = f"{mark_file}.{os.getpid()}"
        with open(tmp, "w") as handle:
            handle.write(f"{os.getpid()} {count}\n")
        os.replace(tmp, mark_file)
        stamped = now
    time.sleep(HOP_S)
    try:
        if os.fork():
            os._exit(0)  # the successor goes on; this pid is gone
    except OSError:  # out of processes for a moment: hop on the next round
        pass
    count += 1
