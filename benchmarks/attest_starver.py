"""A local user that starves the node's attestation socket (tests and CPU benchmarks).

`python -I attest_starver.py UID SOCKET HELD READY LIMIT_S`, started as root: becomes user UID (the
interpreter has read this file by then), then holds HELD connections to SOCKET that never send a
byte, touching READY once it first held them all; one the node answers or closes is replaced at
once. Ends with its parent or after LIMIT_S seconds, whichever is first.
"""

import os
import select
import socket
import sys
import time


def main() -> None:
    uid, path, held_n, ready = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    limit_s = float(sys.argv[5])
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    parent, end = os.getppid(), time.monotonic() + limit_s
    held: list = []
    made = 0
    while time.monotonic() < end and os.getppid() == parent:
        while len(held) < held_n:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(1.0)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                break
            held.append(sock)
            made += 1
            if made == held_n:
                open(ready, "w").close()
        answered = select.select(held, [], [], 0.05)[0] if held else []
        for sock in answered:
            held.remove(sock)
            sock.close()


if __name__ == "__main__":
    main()
