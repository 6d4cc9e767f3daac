"""Who may read a state dir: its owner, but for what other local users must reach by its path.

`pool.db` (and its -wal and -shm) hold every holder, label, lease history, usage sample and token
hash; `STATE/jobs` the job specs with their env. So the state dir is STATE_DIR_MODE: others may
pass through it (to the attestation socket, `STATE/attest/attest.sock`, and to the MPS daemon's
pipes, `STATE/mps/pipe`, both reached by a path they know) but not list it; the store's files
(the database and its siblings, the pool's marker, the server's lock) are STATE_FILE_MODE, and
the folders that hold the pool's data (`private_folder`: the local jobs) PRIVATE_FOLDER_MODE.
The attestation key and records are 0600 from their creation (enforcement/attest.py), the TLS
folder 0700 (server/tls.py). Files and folders of the state dir that gpupool did not make are
left as they are: a `--state` may be a folder that holds other things too.

`make_private` runs at each open of the store (the server's start, every embedded run): it creates
the folder with its mode and narrows what an older gpupool (or a umask) left wider. SQLite gives
the -wal and -shm files the mode of the database file, which `create_database` makes 0600 before
SQLite opens it. What belongs to another user is left alone (only its owner or root may change
its mode); a process that may not read it fails where it opens it, as before.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ...logs import get_logger

log = get_logger(__name__)

STATE_DIR_MODE = 0o711
STATE_FILE_MODE = 0o600
PRIVATE_FOLDER_MODE = 0o700


def make_private(state_dir: Path) -> None:
    """Create `state_dir` (and its parents) if missing; narrow it and the store's files to the modes above."""
    from .db import DB_NAME  # here: db, lock and marker import this module
    from .lock import LOCK_NAME
    from .marker import MARKER_NAME

    state_dir.mkdir(parents=True, exist_ok=True, mode=STATE_DIR_MODE)  # the umask can only narrow it
    _narrow(state_dir, STATE_DIR_MODE)
    try:
        names = os.listdir(state_dir)
    except OSError:  # not ours to read: the store says so when it opens the database
        return
    for name in names:
        # pool.db, its -wal, -shm and -journal, a database moved aside by a restore; pool.id and its partials
        if name == LOCK_NAME or name.startswith((DB_NAME, MARKER_NAME)):
            try:
                if (state_dir / name).is_file():
                    _narrow(state_dir / name, STATE_FILE_MODE)
            except OSError:  # gone meanwhile (a -wal checkpointed away, a racing run's partial marker)
                continue


def private_folder(path: Path) -> Path:
    """`path`, a folder of the pool's data, created or narrowed to PRIVATE_FOLDER_MODE."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER_MODE)
    _narrow(path, PRIVATE_FOLDER_MODE)
    return path


def create_database(path: Path) -> None:
    """Create an empty database file of STATE_FILE_MODE unless one exists: SQLite then fills it,
    and makes its -wal and -shm with the same mode."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, STATE_FILE_MODE))
    except FileExistsError:  # there already, or another process made it first
        pass


def _narrow(path: Path, mode: int) -> None:
    """Take from `path`'s permission bits what `mode` lacks, if this process owns it (or is root)."""
    info = path.lstat()
    if stat.S_IMODE(info.st_mode) & ~mode == 0 or stat.S_ISLNK(info.st_mode):
        return
    if info.st_uid != os.geteuid() and os.geteuid() != 0:
        return
    try:
        os.chmod(path, stat.S_IMODE(info.st_mode) & mode)
    except OSError as err:
        log.warning("cannot make %s private (chmod %o): %s", path, mode, err.strerror)
