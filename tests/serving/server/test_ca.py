"""server.ca: private keys reach the disk 0600 from their creation, whatever the umask, for every
CA and certificate gpupool writes (`--tls auto`, the webhook's and the agents' certificates)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

# Runs in its own process: umask 000, and an audit hook (it cannot be removed again) that looks
# at the mode of every file created under the directory just before each chmod, open, rename and
# remove there, the moments a wider mode could exist before being narrowed. Writes what it saw.
WATCH = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    root, report = sys.argv[1], sys.argv[2]
    created, seen = set(), []

    def look():
        for path in sorted(created):
            try:
                seen.append((path, os.stat(path).st_mode & 0o777))
            except OSError:
                pass

    def hook(event, args):
        if event not in ("open", "os.chmod", "os.rename", "os.remove"):
            return
        look()
        if event == "open" and isinstance(args[0], str) and args[0].startswith(root):
            mode, flags = args[1], args[2]
            writes = any(c in mode for c in "wxa") if isinstance(mode, str) else bool(flags & os.O_CREAT)
            if writes:
                created.add(args[0])
        if event == "os.rename" and isinstance(args[1], str) and args[1].startswith(root):
            created.add(args[1])  # a file renamed into place is looked at from then on too

    os.umask(0)
    sys.addaudithook(hook)
    from gpupool.kube.certs import issue_node_cert, write_ca, write_certs
    from gpupool.serving.server.tls import ensure_self_signed

    ensure_self_signed(Path(root) / "state")
    ensure_self_signed(Path(root) / "state", ["pool.example"])  # the server certificate reissued
    write_certs(str(Path(root) / "webhook"), ["gpupool-webhook", "gpupool-webhook.gpupool.svc"])
    write_ca(str(Path(root) / "agents"), "agent-ca", "gpupool agents CA")
    agents = Path(root) / "agents"
    issue_node_cert(str(Path(root) / "node"), str(agents / "agent-ca.crt"), str(agents / "agent-ca.key"), "n1", ["10.0.0.7"])
    look()
    Path(report).write_text(json.dumps(seen))
    """
)


def test_private_keys_are_never_readable_by_others_even_with_umask_000(tmp_path):
    root, report = tmp_path / "out", tmp_path / "seen.json"
    root.mkdir()
    subprocess.run([sys.executable, "-c", WATCH, str(root), str(report)], check=True, timeout=120)
    seen = json.loads(report.read_text())
    keys = {path for path, _ in seen if ".key" in Path(path).name}
    assert len(keys) >= 5, keys  # the watch saw the keys (and their temporary files) being written
    wide = sorted({(path, oct(mode)) for path, mode in seen if ".key" in Path(path).name and mode & 0o077})
    assert wide == [], f"a private key was readable by group or others: {wide}"

    finals = {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}
    assert {name: oct(mode) for name, mode in finals.items() if name.endswith(".key")} == {
        "state/tls/ca.key": "0o600",
        "state/tls/server.key": "0o600",
        "webhook/ca.key": "0o600",
        "webhook/tls.key": "0o600",
        "agents/agent-ca.key": "0o600",
        "node/tls.key": "0o600",
    }
    # Certificates are public: readable by all even under umask 000 or 077, never writable by others.
    assert {oct(mode) for name, mode in finals.items() if name.endswith(".crt")} == {"0o644"}
    assert not [name for name in finals if name.endswith(".tmp")]  # no temporary file left behind
