"""The cluster's GPU state, as the webhook and the extender see it: node agents polled in the background.

Requests never wait on the network: a thread refreshes every node's
GET /v1/status into a snapshot, and readers take the snapshot. A node whose
last good answer is older than `max_age_s` counts as unknown. Each agent is asked through the
pool's own client (client.http), one kept-alive connection per agent across refreshes.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from ..core.model import Claim, Device
from ..workload.client.http import HttpPoolClient
from .apiserver import core_v1
from .extender import NodeState

log = logging.getLogger(__name__)

Targets = Callable[[], Mapping[str, str]]  # node name -> agent base URL
Pending = Callable[[], Mapping[str, Sequence[Tuple[str, Claim]]]]  # node -> (pod uid, claim) bound there
# Told after a refresh that found room freed (a GPU less used, a node new), and after each later
# refresh until it answers True (done; False: not now, ask again).
Freed = Callable[[], bool]


STATUS_TIMEOUT_S = 2.0  # an agent slower than this counts as not answering this round


class ClusterState:
    """Snapshots of every node agent's state, refreshed by `refresh()` (or a background thread)."""

    def __init__(
        self,
        targets: Targets,
        token: str = "",
        ca: str = "",
        max_age_s: float = 30.0,
        fetch: Optional[Callable[[str], Dict[str, Any]]] = None,
        pending: Optional[Pending] = None,
        clock: Callable[[], float] = time.monotonic,
        workers: int = 16,
        freed: Optional[Freed] = None,
    ) -> None:
        self._targets = targets
        self._token = token
        self._ca = ca
        self._fetch = fetch or self._fetch_status
        self._agents: Dict[str, HttpPoolClient] = {}  # URL -> its client, kept while the URL is a target
        self._pending = pending
        self._freed = freed
        self._room = False  # room freed that `freed` has not been told of yet
        self._clock = clock
        self._max_age_s = max_age_s
        self._workers = workers
        self._lock = threading.Lock()
        self._raw: Dict[str, Tuple[float, NodeState]] = {}
        # Pods this process has just bound (uid -> node, pinned claim, when), counted until the
        # API's pod list shows them: two binds between refreshes must not be given one slice.
        self._assumed: Dict[str, Tuple[str, Claim, float]] = {}
        self._snapshot: Dict[str, NodeState] = {}
        self._sizes: List[int] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _fetch_status(self, url: str) -> Dict[str, Any]:
        """GET {url}/v1/status of one agent, on that agent's kept-alive connection (verified with `ca`)."""
        with self._lock:
            agent = self._agents.get(url)
            if agent is None:
                agent = self._agents[url] = HttpPoolClient(url, self._token, self._ca, STATUS_TIMEOUT_S)
        return agent.request("GET", "/v1/status")

    def _forget_agents(self, urls: Set[str]) -> None:
        """Close the connections of agents no longer listed (a node gone, an address changed)."""
        with self._lock:
            gone = [self._agents.pop(u) for u in list(self._agents) if u not in urls]
        for agent in gone:
            agent.close()

    def set_states(self, states: Mapping[str, NodeState]) -> None:
        """Put states in directly (tests, benchmarks, a static cluster)."""
        now = self._clock()
        with self._lock:
            self._raw = {n: (now, s) for n, s in states.items()}
            self._publish(dict(states))

    def _publish(self, snapshot: Dict[str, NodeState]) -> None:
        # Work done once per refresh rather than in each webhook or extender call.
        for state in snapshot.values():
            state.free_by_size  # noqa: B018 - computes and caches the filter's free vectors
        self._sizes = sorted({d.memory_mib for s in snapshot.values() for d in s.devices})
        self._snapshot = snapshot

    def assume(self, node: str, uid: str, claim: Claim) -> None:
        """Count pod `uid`, just bound to `node` with `claim` (pinned to its GPUs), at once: the
        next bind reads it before any refresh, and refreshes keep it until the pod list has it."""
        with self._lock:
            self._assumed[uid] = (node, claim, self._clock())
            state = self._snapshot.get(node)
            if state is not None and uid not in state.holders:
                snapshot = dict(self._snapshot)
                snapshot[node] = state.with_pending([(uid, claim)])
                self._publish(snapshot)

    def states(self) -> Mapping[str, NodeState]:
        """The current snapshot (a dict never mutated after publication)."""
        return self._snapshot

    def node_devices(self) -> List[Tuple[Device, ...]]:
        return [s.devices for s in self._snapshot.values()]

    def gpu_size(self, memory_mib: int) -> Optional[int]:
        """The smallest known GPU that holds `memory_mib`, else the largest known GPU, else None."""
        sizes = self._sizes
        if not sizes:
            return None
        return next((m for m in sizes if m >= memory_mib), sizes[-1])

    def refresh(self) -> None:
        """Fetch every agent once (in parallel) and publish a new snapshot."""
        targets = dict(self._targets())
        self._forget_agents(set(targets.values()))
        results: Dict[str, Optional[NodeState]] = {}

        def one(item: Tuple[str, str]) -> Tuple[str, Optional[NodeState]]:
            node, url = item
            try:
                return node, NodeState.from_status(self._fetch(url))
            except Exception as err:  # an agent down must not stop the others
                log.debug("agent %s at %s: %s", node, url, err)
                return node, None

        if targets:
            with ThreadPoolExecutor(max_workers=min(self._workers, len(targets))) as pool:
                results = dict(pool.map(one, targets.items()))
        now = self._clock()
        listed = self._pending() if self._pending else {}
        with self._lock:
            raw = {n: v for n, v in self._raw.items() if n in targets}
            for node, state in results.items():
                if state is not None:
                    raw[node] = (now, state)
            self._raw = raw
            pending = self._with_assumed(listed, raw, now)
            snapshot = {}
            for node, (seen, state) in raw.items():
                if now - seen <= self._max_age_s:
                    snapshot[node] = state.with_pending(pending.get(node, ())) if pending else state
            self._room = self._room or _room_freed(self._snapshot, snapshot)
            self._publish(snapshot)
        if self._room and self._freed is not None:
            try:
                self._room = not self._freed()
            except Exception:  # told again after the next refresh; the refresh goes on
                log.exception("telling of freed room failed")

    def _with_assumed(
        self, listed: Mapping[str, Sequence[Tuple[str, Claim]]], raw: Mapping[str, Tuple[float, NodeState]], now: float
    ) -> Dict[str, List[Tuple[str, Claim]]]:
        """The listed pods plus the assumed binds the list or the agents do not show yet (under the lock);
        an assumed bind is dropped once shown, or after `max_age_s` (its pod was deleted at once)."""
        pending = {node: list(pods) for node, pods in listed.items()}
        shown = {uid for pods in listed.values() for uid, _ in pods}
        shown |= {uid for _, state in raw.values() for uid in state.holders}
        for uid, (node, claim, when) in list(self._assumed.items()):
            if uid in shown or now - when > self._max_age_s:
                del self._assumed[uid]
            else:
                pending.setdefault(node, []).append((uid, claim))
        return pending

    def start(self, interval_s: float = 2.0) -> None:
        """Refresh every `interval_s` in a daemon thread."""

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.refresh()
                except Exception:  # keep the last snapshot; log and go on
                    log.exception("refreshing the cluster GPU state failed")
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=loop, name="gpupool-cluster-state", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._forget_agents(set())


def _room_freed(before: Mapping[str, NodeState], after: Mapping[str, NodeState]) -> bool:
    """Whether `after` has room `before` did not: a node new, or a GPU with less held on it."""
    for node, state in after.items():
        old = before.get(node)
        if old is None:
            return True
        if any(mib < old.allocated.get(uuid, 0) for uuid, mib in state.allocated.items()):
            return True
    return False


def static_targets(spec: str) -> Targets:
    """'node-a=http://10.0.0.1:56001,node-b=...' as a targets function."""
    table = {}
    for part in spec.split(","):
        if "=" in part:
            node, url = part.split("=", 1)
            table[node.strip()] = url.strip()
    return lambda: table


def kube_targets(port: int, scheme: str = "http") -> Targets:  # pragma: no cover - needs an API server
    """Agents at each node's InternalIP (in cluster, through the kubernetes client)."""
    api = core_v1("the webhook finds the node agents", "pass --agents NODE=URL,...")

    def targets() -> Dict[str, str]:
        out = {}
        for node in api.list_node(label_selector="gpupool.io/agent=true").items:
            for addr in node.status.addresses or []:
                if addr.type == "InternalIP":
                    out[node.metadata.name] = f"{scheme}://{addr.address}:{port}"
                    break
        return out

    return targets


def kube_pending() -> Pending:  # pragma: no cover - needs an API server
    """Pods bound to a node with a gpupool claim and not ended (in cluster), for
    `NodeState.with_pending`, which skips those whose runner holds its lease: on the GPUs the
    extender's bind recorded for them, else wherever their claim fits. Running ones too: a
    container runs a moment before its runner has claimed."""
    from .choice import pinned_claim
    from .extender import pod_claim

    api = core_v1("the extender counts pods bound but not yet started", "pass --agents NODE=URL,...")

    def pending() -> Dict[str, List[Tuple[str, Claim]]]:
        out: Dict[str, List[Tuple[str, Claim]]] = {}
        pods = api.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        )
        for pod in pods.items:
            if not pod.spec.node_name or not (pod.metadata.annotations or {}).get("gpupool.io/claim"):
                continue
            shape = {"metadata": {"annotations": pod.metadata.annotations}, "spec": {}}
            claim = pinned_claim(shape) or pod_claim(shape)
            if claim is not None:
                out.setdefault(pod.spec.node_name, []).append((pod.metadata.uid, claim))
        return out

    return pending


REQUEUE_EVERY_S = 2.0  # at most one pass over the unschedulable pods this often


def kube_requeue() -> Freed:  # pragma: no cover - needs an API server
    """Nudge the GPU pods kube-scheduler left unschedulable (a `gpupool.io/requeue` annotation,
    a pod update, which puts a pod back in the scheduler's queue) once this process has read the
    room freed: kube-scheduler's own retry when a pod is deleted can reach the extender first,
    and without another event in the cluster it would not retry for minutes."""
    from . import annotations as ann

    api = core_v1("the extender requeues pods when room frees", "pass --agents NODE=URL,...")
    last = [-REQUEUE_EVERY_S]

    def requeue() -> bool:
        now = time.monotonic()
        if now - last[0] < REQUEUE_EVERY_S:
            return False  # asked again after the next refresh
        last[0] = now
        pods = api.list_pod_for_all_namespaces(field_selector="spec.nodeName=,status.phase=Pending")
        for pod in pods.items:
            meta = pod.metadata
            if not (meta.annotations or {}).get(ann.CLAIM) or not any(
                c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                for c in (pod.status.conditions or [])
            ):
                continue
            patch = {"metadata": {"annotations": {ann.REQUEUE: f"{time.time():.3f}"}}}
            api.patch_namespaced_pod(meta.name, meta.namespace, patch)
            log.info("room freed: asked the scheduler to retry %s/%s", meta.namespace, meta.name)
        return True

    return requeue
