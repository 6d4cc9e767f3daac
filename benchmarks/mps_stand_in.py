"""A stand-in for the NVIDIA driver's `nvidia-cuda-mps-control`, for tests and CPU benchmarks.

It behaves like the control daemon for what gpupool uses: `-f` serves control commands on
PIPE/control (a UNIX socket) until `quit`; `-d` does the same in a detached grandchild; no flag is
the client (`echo CMD | nvidia-cuda-mps-control`), which connects there and fails without a
daemon. It cannot start an MPS server: it stands in for the daemon's control interface only.
Installed as an executable named nvidia-cuda-mps-control whose first line is `#!` and a Python.

FAKE_MPS_RECORD=DIR: each daemon writes DIR/PID.json (its argv and env); FAKE_MPS_SERVER=1: it
starts a long-lived child as its "MPS server"; FAKE_MPS_IGNORE_QUIT=1: it ignores `quit`;
FAKE_MPS_HOLD=FILE: while FILE exists a daemon that starts does not listen yet (one that is slow to
come up), so nothing answers on the pipe folder.
"""

import json
import os
import socket
import subprocess
import sys
import time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
CONTROL = os.path.join(PIPE, "control")


def serve() -> None:
    record = os.environ.get("FAKE_MPS_RECORD")
    if record:
        with open(os.path.join(record, "%d.json" % os.getpid()), "w") as f:
            json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, f)
    if record and os.environ.get("FAKE_MPS_SERVER"):  # an "MPS server" in the daemon's process group
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(os.path.join(record, "server-%d.pid" % os.getpid()), "w") as f:
            f.write(str(server.pid))
    hold = os.environ.get("FAKE_MPS_HOLD")
    while hold and os.path.exists(hold):
        time.sleep(0.05)
    if os.path.exists(CONTROL):
        os.unlink(CONTROL)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(CONTROL)
    sock.listen(8)
    while True:
        conn, _ = sock.accept()
        command = conn.makefile().readline().strip()
        if command == "quit" and not os.environ.get("FAKE_MPS_IGNORE_QUIT"):
            conn.close()
            os.unlink(CONTROL)
            sys.exit(0)
        try:  # a client that connected and left (a probe of the socket alone) is no reason to die
            conn.sendall(b"100\n")
        except OSError:
            pass
        conn.close()


def detach() -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            serve()
        os._exit(0)
    os.wait()


def client() -> None:
    for line in sys.stdin:
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.connect(CONTROL)
        except OSError:
            sys.stderr.write("Cannot find MPS control daemon process\n")
            sys.exit(1)
        sock.sendall(line.encode())
        sys.stdout.write(sock.makefile().read())


if __name__ == "__main__":
    if sys.argv[1:] == ["-f"]:
        serve()
    elif sys.argv[1:] == ["-d"]:
        detach()
    else:
        client()
