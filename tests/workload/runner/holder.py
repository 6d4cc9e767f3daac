"""A workload for runner tests: records its env and pid, then holds until told to stop.

Usage: python holder.py RECORD_FILE [STOP_FILE] [EXIT_CODE]
"""

import json
import os
import sys
import time

record, stop = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "")
code = int(sys.argv[3]) if len(sys.argv) > 3 else 0
tmp = record + ".tmp"
with open(tmp, "w") as handle:
    json.dump({"pid": os.getpid(), "pgid": os.getpgrp(), "env": dict(os.environ)}, handle)
os.replace(tmp, record)  # atomic: the test never reads half a file
deadline = time.time() + 60
while stop and not os.path.exists(stop) and time.time() < deadline:
    time.sleep(0.02)
sys.exit(code)
