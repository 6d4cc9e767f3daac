"""Who may read a state dir: its owner only, but for the two folders other local users must reach.

`pool.db` (and its -wal and -shm) hold every holder, label, lease history, usage sample and token
hash; `STATE/jobs` the job specs with their env. So the state dir is STATE_DIR_MODE: others may
pass through it (to the attestation socket, `STATE/attest/attest.sock`, and to the MPS daemon's
pipes, `STATE/mps/pipe`, both reached by a path they know) but neither list it nor open anything
else: every file in it is STATE_FILE_MODE and every other folder PRIVATE_FOLDER_MODE.

`make_private` runs at each open of the store (the server's start, every embedded run): it creates
the folder with its mode and narrows what an older gpupool (or a umask) left wider. SQLite gives
the -wal and -shm files the mode of the database file, which `create_database` makes 0600 before
SQLite opens it. A folder or file of another user is left alone (only its owner or root may
change its mode); a process that may not read it fails where it opens it, as before.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..core.attestation import SOCKET_DIR
from ..core.isolation_mode import MPS_DIR
from ..logs import get_logger

log = get_logger(__name__)

STATE_DIR_MODE = 0o711
STATE_FILE_MODE = 0o600
PRIVATE_FOLDER_MODE = 0o700
# Folders other users reach by path: their own modes are their owners' business (attest_listener, mps).
SHARED_FOLDERS = frozenset({SOCKET_DIR, MPS_DIR})


def make_private(state_dir: Path) -> None:
    """Create `state_dir` (and its parents) if missing; give it, its files and its folders the modes above."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=STATE_DIR_MODE)  # the umask can only narrow it
    _narrow(state_dir, STATE_DIR_MODE)
    try:
        entries = list(os.scandir(state_dir))
    except OSError:  # not ours to read: the store says so when it opens the database
        return
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                _narrow(Path(entry.path), STATE_FILE_MODE)
            elif entry.is_dir(follow_symlinks=False) and entry.name not in SHARED_FOLDERS:
                _narrow(Path(entry.path), PRIVATE_FOLDER_MODE)
        except OSError:  # gone meanwhile (a -wal checkpointed away, a racing run's partial marker)
            continue


def create_database(path: Path) -> None:
    """Create an empty database file of STATE_FILE_MODE unless one exists: SQLite then fills it,
    and makes its -wal and -shm with the same mode."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, STATE_FILE_MODE))
    except FileExistsError:  # there already, or another process made it first
        pass


def _narrow(path: Path, mode: int) -> None:
    """Set `path`'s permission bits to `mode` when they are wider, if this process owns it (or is root)."""
    info = path.lstat()
    if stat.S_IMODE(info.st_mode) & ~mode == 0:
        return
    if info.st_uid != os.geteuid() and os.geteuid() != 0:
        return
    try:
        os.chmod(path, stat.S_IMODE(info.st_mode) & mode)
    except OSError as err:
        log.warning("cannot make %s private (chmod %o): %s", path, mode, err.strerror)
