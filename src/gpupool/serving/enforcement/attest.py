"""Lease keys and the runners the node saw prove their lease (the attestations attribution trusts).

A lease's key is HMAC-SHA256(node secret, lease id): the server hands it to the claimant in the
claim's answer only (never in a status or a listing), and recomputes it to check an attestation,
so nothing per lease is stored. The secret is STATE/attest.key (0600), made at the first start.

An attestation is a `Witness` (pid and start time from the kernel) recorded for a live lease, or
a pod the node itself assigned the lease to (the DRA plugin: the pods its ResourceClaim is reserved
for, from the API server; a witness with pid 0). The records are kept in memory and mirrored to
STATE/attestations.json (0600), so a restarted server still knows its runners; one registry per
state dir in a process (`node_attestations`), shared by the socket and the DRA plugin. They end
with their lease (`current` drops those of leases no longer live).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Collection, Dict, List, Optional

from ...core.attestation import SOCKET_DIR, SOCKET_NAME, AttestTicket
from ...core.errors import InvalidInput
from ...pooling.isolation.evidence import Witness

log = logging.getLogger(__name__)

SECRET_FILE = "attest.key"
RECORDS_FILE = "attestations.json"
# Runners (nested runs, restarts of a job's supervisor) one lease may attest; a lease past it is
# refused more, so one key cannot grow the node's memory without bound.
MAX_PIDS_PER_LEASE = 64


def socket_path(state_dir: Path) -> Path:
    """The node's attestation socket: alone in its folder, which pods mount read-only."""
    return Path(state_dir).resolve() / SOCKET_DIR / SOCKET_NAME


class AttestKeys:
    """Issues and checks per-lease keys from the node secret in `state_dir`."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.socket = str(socket_path(self.state_dir))
        self._secret = _load_or_create_secret(self.state_dir / SECRET_FILE)

    def key(self, lease_id: str) -> str:
        """The lease's key (64 hex digits)."""
        return hmac.new(self._secret, lease_id.encode("utf-8"), hashlib.sha256).hexdigest()

    def ticket(self, lease_id: str) -> AttestTicket:
        """What the claim's answer carries: the lease's key and this node's socket."""
        return AttestTicket(self.key(lease_id), self.socket)

    def check(self, lease_id: str, key: str) -> bool:
        """Whether `key` is the lease's key (in constant time)."""
        return hmac.compare_digest(self.key(lease_id), key)


def _load_or_create_secret(path: Path) -> bytes:
    """The node secret: 32 random bytes, hex in a 0600 file created at the first start."""
    try:
        text = path.read_text().strip()
        if len(text) >= 64:
            return bytes.fromhex(text)
        log.warning("%s is damaged (%d characters): a new attestation secret replaces it", path, len(text))
    except FileNotFoundError:
        pass
    except ValueError:
        log.warning("%s is not hex: a new attestation secret replaces it", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret.hex() + "\n")
    os.replace(tmp, path)
    return secret


_REGISTRIES: Dict[Path, Attestations] = {}
_REGISTRIES_LOCK = threading.Lock()


def node_attestations(state_dir: Path) -> Attestations:
    """The one registry of `state_dir` in this process (mirrored to STATE/attestations.json)."""
    path = Path(state_dir).resolve() / RECORDS_FILE
    with _REGISTRIES_LOCK:
        if path not in _REGISTRIES:
            _REGISTRIES[path] = Attestations(path)
        return _REGISTRIES[path]


class Attestations:
    """Witnessed runners per lease; safe to share between the listener's threads and the watchdog."""

    def __init__(self, path: Optional[Path] = None, max_per_lease: int = MAX_PIDS_PER_LEASE) -> None:
        self.path = path
        self.max_per_lease = max_per_lease
        self._lock = threading.Lock()
        self._by_lease: Dict[str, List[Witness]] = self._load()

    def add(self, lease_id: str, witness: Witness) -> None:
        """Record that `witness` attested `lease_id`; InvalidInput past the per-lease cap."""
        with self._lock:
            mine = self._by_lease.setdefault(lease_id, [])
            if any(w.pid == witness.pid and w.start_ticks == witness.start_ticks for w in mine if w.pid):
                return
            if not witness.pid and witness in mine:
                return
            # A pid reused since (another start time) is not this lease's any more.
            mine[:] = [w for w in mine if w.pid != witness.pid]
            if len(mine) >= self.max_per_lease:
                raise InvalidInput(
                    f"lease {lease_id} has attested {len(mine)} processes, the most one lease may: "
                    "attest the runner once, its children are attributed with it"
                )
            mine.append(witness)
            self._save()

    def add_pod(self, lease_id: str, pod_uid: str) -> None:
        """Record that the node assigned `lease_id` to pod `pod_uid` (no runner: its processes are the pod's)."""
        self.add(lease_id, Witness(0, 0, -1, pod_uid))

    def current(self, live: Collection[str]) -> Dict[str, List[Witness]]:
        """The attestations of the live leases `live`; those of every other lease are forgotten."""
        with self._lock:
            gone = [lease_id for lease_id in self._by_lease if lease_id not in live]
            for lease_id in gone:
                del self._by_lease[lease_id]
            if gone:
                self._save()
            return {lease_id: list(found) for lease_id, found in self._by_lease.items()}

    def _load(self) -> Dict[str, List[Witness]]:
        if self.path is None:
            return {}
        try:
            raw = json.loads(self.path.read_text())
            return {str(lease_id): [Witness.from_dict(w) for w in found] for lease_id, found in raw.items()}
        except FileNotFoundError:
            return {}
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            # Runners attested before are then unknown: their processes count as unleased until they end.
            log.warning("%s is damaged (%s): the node forgets the runners attested before", self.path, err)
            return {}

    def _save(self) -> None:
        if self.path is None:
            return
        data = {lease_id: [w.to_dict() for w in found] for lease_id, found in self._by_lease.items()}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle, separators=(",", ":"))
            os.replace(tmp, self.path)
        except OSError as err:  # the records in memory still hold; only a restart would forget them
            log.warning("cannot save the attestations to %s: %s", self.path, err)
