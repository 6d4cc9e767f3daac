"""The prepared claims, on disk: what a restarted plugin (even after kill -9) needs to answer
prepare again with the same devices and to release the right lease at unprepare.

One JSON file, rewritten atomically (temporary file, fsync, rename) after every change, so it
holds either the state before a change or the state after it.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .cdi import write_json_atomically

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources answers it."""

    request_names: Tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: Tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    """A claim prepared on this node: its identity, its lease in the node's pool and its devices."""

    uid: str
    namespace: str
    name: str
    lease_id: str
    devices: Tuple[PreparedDevice, ...] = field(default_factory=tuple)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreparedClaim:
        devices = tuple(
            PreparedDevice(
                tuple(d.get("request_names", ())),
                str(d["pool_name"]),
                str(d["device_name"]),
                tuple(d.get("cdi_device_ids", ())),
            )
            for d in data.get("devices", ())
        )
        return cls(str(data["uid"]), str(data["namespace"]), str(data["name"]), str(data["lease_id"]), devices)


class PreparedStore:
    """The prepared claims of this node, kept in `path` (thread-safe)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._claims: Dict[str, PreparedClaim] = self._load()

    def _load(self) -> Dict[str, PreparedClaim]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            # Losing it would lose leases silently; refusing to start says what to look at.
            raise RuntimeError(
                f"the DRA prepared-claims file {self.path} cannot be read ({err}): fix or move it"
            ) from None
        claims = {}
        for uid, entry in (data.get("claims") or {}).items():
            try:
                claims[uid] = PreparedClaim.from_dict(entry)
            except (KeyError, TypeError) as err:
                log.warning("DRA prepared claims: claim %s is malformed (%s): left out", uid, err)
        return claims

    def _save(self) -> None:
        document = {"version": CHECKPOINT_VERSION, "claims": {u: c.to_dict() for u, c in self._claims.items()}}
        write_json_atomically(self.path, document)

    def get(self, uid: str) -> Optional[PreparedClaim]:
        with self._lock:
            return self._claims.get(uid)

    def all(self) -> List[PreparedClaim]:
        with self._lock:
            return list(self._claims.values())

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            self._claims[claim.uid] = claim
            self._save()

    def remove(self, uid: str) -> None:
        with self._lock:
            if self._claims.pop(uid, None) is not None:
                self._save()
