"""The emulated usage file: what each process uses on each emulated GPU, where NVML would say it.

The file named by EMULATED_USAGE_ENV holds ``{"GPU-uuid": {"PID": ROW}}``, a ROW being the MiB the
process holds (a number) or ``{"memory_mib": MiB, "utilization": SHARE, "mps_client": BOOL}`` with
the SM busy share in [0, 1] that NVML's per-process utilisation gives and whether NVML lists the
process as an MPS client (true) or as an ordinary compute process, outside MPS (false); each key
but memory_mib may be left out, and a row without "mps_client" says nothing of MPS, as rows
written before it did. The watchdog's sampler reads it
(devices/usage.py) and the emulated suspend backend moves rows out and back (parking.py):
one reader and one writer of the format, here. Standard library only.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict

from .env import EMULATED_USAGE_ENV as EMULATED_USAGE_ENV  # the file's env name, defined once there

if TYPE_CHECKING:
    from typing import Mapping, Optional, Union

# A usage file is a handful of pids per GPU; a larger one is a mistake, not a sample.
MAX_USAGE_FILE_BYTES = 1 << 20
MAX_MIB = 2**40
# The file an emulated pool keeps in its state dir when EMULATED_USAGE_ENV names none: its status
# says where (PoolStatus.emulated_usage), so the server's watchdog, the runner's suspend backend and
# the command (given it in EMULATED_USAGE_ENV) read and write the same one.
DEFAULT_USAGE_FILE = "emulated-usage.json"
SHAPE = '{"GPU-uuid": {"PID": MiB or {"memory_mib": MiB, "utilization": 0..1, "mps_client": true|false}}}'


@dataclass(frozen=True)
class UsageRow:
    """One process on one GPU: the MiB it holds and, when known, how busy it keeps the GPU and
    whether it is an MPS client (None: not said)."""

    memory_mib: int
    utilization: Optional[float] = None
    mps_client: Optional[bool] = None

    def to_json(self) -> Union[int, Dict[str, Union[int, float, bool]]]:
        if self.utilization is None and self.mps_client is None:
            return self.memory_mib
        row: Dict[str, Union[int, float, bool]] = {"memory_mib": self.memory_mib}
        if self.utilization is not None:
            row["utilization"] = self.utilization
        if self.mps_client is not None:
            row["mps_client"] = self.mps_client
        return row


Usage = Dict[str, Dict[int, UsageRow]]


def usage_file(pool_default: str = "") -> str:
    """The emulated usage file in force: the one EMULATED_USAGE_ENV names, else the pool's own."""
    return os.environ.get(EMULATED_USAGE_ENV, "").strip() or pool_default


def parse_usage(data: object) -> Usage:
    """Check and convert the file's JSON; ValueError names what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("the top level must be an object keyed by GPU UUID")
    result: Usage = {}
    for uuid, pids in data.items():
        if not isinstance(pids, dict):
            raise ValueError(f"{uuid!r} must map to an object of PID: MiB")
        rows: Dict[int, UsageRow] = {}
        for pid, row in pids.items():
            try:
                number = int(pid)
            except ValueError:
                raise ValueError(f"PID {pid!r} of {uuid!r} is not an integer") from None
            if number > 0:
                rows[number] = _row(row, f"PID {pid} on {uuid!r}")
        result[str(uuid)] = rows
    return result


def _row(value: object, where: str) -> UsageRow:
    utilization: Optional[float] = None
    mps_client: Optional[bool] = None
    mib = value
    if isinstance(value, dict):
        mib, share, client = value.get("memory_mib"), value.get("utilization"), value.get("mps_client")
        if share is not None:
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
                raise ValueError(f"utilization {share!r} of {where} must be a share in [0, 1]")
            utilization = float(share)
        if client is not None:
            if not isinstance(client, bool):
                raise ValueError(f"mps_client {client!r} of {where} must be true or false")
            mps_client = client
    if isinstance(mib, bool) or not isinstance(mib, (int, float)) or not 0 <= mib < MAX_MIB:
        raise ValueError(f"MiB {mib!r} of {where} must be a number >= 0")
    return UsageRow(int(mib), utilization, mps_client)


def read_usage(path: str) -> Usage:
    """The file at `path` ({} when missing); OSError when unreadable, ValueError when damaged."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_USAGE_FILE_BYTES + 1)
    except FileNotFoundError:
        return {}
    if len(raw) > MAX_USAGE_FILE_BYTES:
        raise ValueError(f"larger than {MAX_USAGE_FILE_BYTES} bytes")
    try:
        return parse_usage(json.loads(raw or b"{}"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def write_usage(path: str, usage: Mapping[str, Mapping[int, UsageRow]]) -> None:
    """Write atomically: a sampler reading at the same moment sees the old file or the new, whole."""
    text = json.dumps({uuid: {str(pid): row.to_json() for pid, row in rows.items()} for uuid, rows in usage.items()})
    fd, tmp = tempfile.mkstemp(prefix=".usage-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
