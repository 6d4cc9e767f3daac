"""Run jobs on Kubernetes: Indexed Jobs + headless Service, or Kubeflow TFJob/PyTorchJob.

Rendering is pure (jobs/manifests/), so is reading a job's phase from its objects
(kube_status.py); this module is the I/O: create, read objects and logs, delete, through
`JobApi`, a thin layer over the kubernetes client that speaks the API's JSON (dicts), so
tests stand in for the API server with objects shaped as it serves them. Kubernetes does
the supervising (restarts, deadline), the gpupool webhook and node agent do the GPU shares.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import replace
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import yaml

from ...core.errors import Forbidden, GpupoolError, InvalidInput, NotFound, ServerUnreachable
from ..environment import redacted_manifest
from ..manifests import render_indexed, render_kubeflow
from ..manifests.indexed import JOB_LABEL, ROLE_LABEL
from ..manifests.versions import KubeVersion, parse_kube_version
from ..phase import Phase
from ..spec import JobSpec
from .base import DryRunInfo, Executor, JobDescription
from .kube_status import Obj, describe_indexed, describe_kubeflow, replica_name, unfinished

GROUP, VERSION = "kubeflow.org", "v1"
PLURALS = {"TFJob": "tfjobs", "PyTorchJob": "pytorchjobs"}
log = logging.getLogger(__name__)
_LOG_POLL_S = 2.0
_LOG_GRACE_S = 5.0  # after the job ended, how long to keep reading logs still streaming


class JobApi:
    """The calls the executor makes, as API JSON: the kubernetes client's models are
    serialized back to the dicts the API sent, and its errors become gpupool's."""

    def __init__(self) -> None:
        try:
            from kubernetes import client
        except ImportError:
            raise InvalidInput("--target kubernetes needs the kube extra: pip install 'gpupool[kube]'") from None
        from ...kube.kubeconfig import KUBECONFIG_FIRST, api_client

        self._client = api_client(
            "--target kubernetes runs the job",
            "set KUBECONFIG or ~/.kube/config, or use --dry-run to print the manifests",
            KUBECONFIG_FIRST,
        )
        self.core = client.CoreV1Api(self._client)
        self.batch = client.BatchV1Api(self._client)
        self.custom = client.CustomObjectsApi(self._client)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, **kwargs)
        except ApiException as err:
            raise api_error(what, err.status or 0, err.reason or "", err.body) from None
        except (OSError, HTTPError) as err:  # connection refused, DNS, TLS (urllib3 wraps them)
            raise ServerUnreachable(f"{what}: the Kubernetes API server is unreachable ({err})") from None

    def _json(self, model: Any) -> Any:
        return self._client.sanitize_for_serialization(model)

    def server_version(self) -> str:
        """The API server's gitVersion, e.g. v1.30.2."""
        from kubernetes import client

        info = self._call("read the server version", client.VersionApi(self._client).get_code)
        return str(info.git_version)

    def create(self, obj: Dict[str, Any]) -> None:
        ns, kind = obj["metadata"]["namespace"], obj["kind"]
        what = f"create {kind} {ns}/{obj['metadata']['name']}"
        if kind == "Service":
            self._call(what, self.core.create_namespaced_service, ns, obj)
        elif kind == "Job":
            self._call(what, self.batch.create_namespaced_job, ns, obj)
        else:
            self._call(what, self.custom.create_namespaced_custom_object, GROUP, VERSION, ns, PLURALS[kind], obj)

    def jobs(self, ns: str, selector: str) -> List[Obj]:
        found = self._call(f"list Jobs in {ns}", self.batch.list_namespaced_job, ns, label_selector=selector)
        return list(self._json(found).get("items") or [])

    def pods(self, ns: str, selector: str) -> List[Obj]:
        found = self._call(f"list Pods in {ns}", self.core.list_namespaced_pod, ns, label_selector=selector)
        return list(self._json(found).get("items") or [])

    def services(self, ns: str, selector: str) -> List[Obj]:
        found = self._call(f"list Services in {ns}", self.core.list_namespaced_service, ns, label_selector=selector)
        return list(self._json(found).get("items") or [])

    def custom_objects(self, ns: str, plural: str, selector: str) -> List[Obj]:
        found = self._call(
            f"list {plural} in {ns}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            plural,
            label_selector=selector,
        )
        return list(found.get("items") or [])

    def custom_object(self, ns: str, plural: str, name: str) -> Obj:
        return dict(
            self._call(
                f"get {plural} {ns}/{name}", self.custom.get_namespaced_custom_object, GROUP, VERSION, ns, plural, name
            )
        )

    def delete(self, kind: str, ns: str, name: str) -> None:
        what = f"delete {kind} {ns}/{name}"
        # The answer (a Status, or the object while finalizers run) is not read: only errors matter.
        raw = {"_preload_content": False}
        if kind == "Job":
            # Foreground: the Job stays (with a deletionTimestamp) until its pods are gone.
            resp = self._call(what, self.batch.delete_namespaced_job, name, ns, propagation_policy="Foreground", **raw)
        elif kind == "Service":
            resp = self._call(what, self.core.delete_namespaced_service, name, ns, **raw)
        else:
            resp = self._call(
                what,
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                ns,
                PLURALS[kind],
                name,
                propagation_policy="Foreground",
                **raw,
            )
        resp.release_conn()

    def log(self, ns: str, pod: str, container: str, follow: bool) -> Iterator[str]:
        """The container's log lines; with `follow`, until the container ends."""
        what = f"logs of {ns}/{pod}"
        if not follow:
            text = self._call(what, self.core.read_namespaced_pod_log, pod, ns, container=container)
            yield from str(text).splitlines()
            return
        resp = self._call(
            what, self.core.read_namespaced_pod_log, pod, ns, container=container, follow=True, _preload_content=False
        )
        pending = b""
        try:
            for chunk in resp.stream(4096):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    yield line.decode("utf-8", "replace")
            if pending:
                yield pending.decode("utf-8", "replace")
        finally:
            resp.release_conn()


def api_error(what: str, status: int, reason: str, body: Any) -> GpupoolError:
    """An API server's error answer as gpupool's error, with its message (a Status object)."""
    message = reason
    try:
        message = json.loads(body).get("message") or reason
    except (TypeError, ValueError, AttributeError):
        pass
    text = f"{what}: {message} (HTTP {status})"
    if status == 404:
        return NotFound(text)
    if status in (401, 403):
        return Forbidden(f"{text}; check your kubeconfig's user and its RBAC in that namespace")
    if status in (400, 409, 422):
        return InvalidInput(text)
    return GpupoolError(text)


class KubernetesExecutor(Executor):
    """`flavour` "kubernetes" (native Indexed Jobs) or "kubeflow" (training-operator kinds).

    `kube_version` ("1.29") renders for that Kubernetes release; without it a dry run renders
    for the newest, and `schedule` renders again for the API server's version when it differs.
    """

    poll_s = 2.0

    def __init__(
        self,
        flavour: str = "kubernetes",
        namespace: Optional[str] = None,
        api: Any = None,
        kube_version: Optional[str] = None,
    ) -> None:
        self.target = flavour
        self.namespace = namespace
        self._api = api
        self.kube_version: Optional[KubeVersion] = parse_kube_version(kube_version) if kube_version else None

    def render(self, spec: JobSpec, kube_version: Optional[KubeVersion] = None) -> List[Dict[str, Any]]:
        if self.namespace:
            spec = replace(spec, namespace=self.namespace)
        if self.target == "kubeflow":
            return render_kubeflow(spec)
        return render_indexed(spec, kube_version or self.kube_version)

    def dryrun(self, spec: JobSpec) -> DryRunInfo:
        manifests = self.render(spec)
        shown = redacted_manifest(manifests)  # what is printed; `manifests` is what gets created
        text = yaml.safe_dump_all(shown, sort_keys=False, default_flow_style=False, width=120)
        return DryRunInfo(self.target, spec, manifests, text)

    def api(self) -> Any:
        """The API layer: JobApi over ~/.kube/config or the in-cluster service account."""
        if self._api is None:
            self._api = JobApi()
        return self._api

    def schedule(self, info: DryRunInfo) -> str:
        api = self.api()
        request = info.request
        if self.kube_version is None and self.target != "kubeflow":
            server = parse_kube_version(api.server_version())
            again = self.render(info.spec, server)
            if again != request:
                log.info("rendered again for the API server's Kubernetes %d.%d", *server)
                request = again
        for obj in request:
            api.create(obj)
        return info.spec.name

    def _ns(self) -> str:
        return self.namespace or "default"

    def _pods(self, name: str) -> List[Obj]:
        return list(self.api().pods(self._ns(), f"{JOB_LABEL}={name}"))

    def _kubeflow_object(self, name: str) -> Optional[Tuple[str, Obj]]:
        """(kind, object) of the TFJob or PyTorchJob named `name`, or None."""
        for kind, plural in PLURALS.items():
            try:
                return kind, self.api().custom_object(self._ns(), plural, name)
            except NotFound:
                continue
        return None

    # --- inspect ---------------------------------------------------------------
    def describe(self, name: str) -> JobDescription:
        if self.target == "kubeflow":
            found = self._kubeflow_object(name)
            if found is None:
                raise NotFound(f"no TFJob or PyTorchJob named {name!r} in namespace {self._ns()}")
            return describe_kubeflow(name, found[1], self._pods(name), self.target)
        jobs = self.api().jobs(self._ns(), f"{JOB_LABEL}={name}")
        pods = self._pods(name)
        if not jobs and not pods:
            raise NotFound(f"no job named {name!r} in namespace {self._ns()}")
        return describe_indexed(name, jobs, pods, self.target)

    def list(self) -> List[JobDescription]:
        api, ns = self.api(), self._ns()
        if self.target == "kubeflow":
            out = []
            for plural in PLURALS.values():
                try:
                    objs = api.custom_objects(ns, plural, JOB_LABEL)
                except NotFound:  # the operator (its CRD) is not installed
                    continue
                for obj in objs:
                    name = obj["metadata"]["name"]
                    out.append(describe_kubeflow(name, obj, self._pods(name), self.target))
        else:
            by_name: Dict[str, List[Obj]] = {}
            for job in api.jobs(ns, JOB_LABEL):
                by_name.setdefault(job["metadata"]["labels"][JOB_LABEL], []).append(job)
            out = [describe_indexed(n, jobs, self._pods(n), self.target) for n, jobs in by_name.items()]
        return sorted(out, key=lambda d: (d.submitted_at or 0.0, d.name))

    def log_lines(self, name: str, replica: Optional[str] = None, follow: bool = False) -> Iterator[str]:
        """Every replica's log (prefixed "[worker-1] " when there are several), or one's.
        With `follow`, each pod's log is streamed as it starts (retries and restarts too),
        until the job ends."""
        if follow:  # pods that have not started yet are waited for
            yield from self._follow(name, replica)
            return
        pods = self._replica_pods(name, replica)
        many = replica is None and len({replica_name(p) for p in pods}) > 1
        for pod in pods:
            for line in self.api().log(self._ns(), pod["metadata"]["name"], _container(pod), False):
                yield f"[{replica_name(pod)}] {line}" if many else line

    def _replica_pods(self, name: str, replica: Optional[str]) -> List[Obj]:
        """The job's pods (of `replica` only, when given) whose container has a log, oldest first."""
        pods = self._pods(name)
        if not pods:
            self.describe(name)  # NotFound for a job that does not exist
        _check_replica(name, replica, pods)
        chosen = [p for p in pods if (replica is None or replica_name(p) == replica) and _started(p)]
        if not chosen:
            raise NotFound(f"job {name!r}: no replica has started yet; `gpupool jobs {name}` says why")
        return sorted(chosen, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    def _follow(self, name: str, replica: Optional[str]) -> Iterator[str]:
        """Stream every started container's log through one queue, one thread per container
        run (a restarted container is streamed again), until the job is terminal or gone."""
        lines: queue.Queue[Tuple[str, Optional[str]]] = queue.Queue()
        streams: Set[str] = set()
        api, ns = self.api(), self._ns()

        def pump(pod: Obj) -> None:
            tag = replica_name(pod)
            try:
                for line in api.log(ns, pod["metadata"]["name"], _container(pod), True):
                    lines.put((tag, line))
            except GpupoolError as err:
                lines.put((tag, f"(log stream ended: {err.message})"))
            finally:
                lines.put((tag, None))

        self.describe(name)  # NotFound at once for an unknown job
        _check_replica(name, replica, self._pods(name))
        names: Set[str] = set()
        running = 0
        ended_at: Optional[float] = None
        while True:
            if ended_at is None:
                pods = [p for p in self._pods(name) if replica is None or replica_name(p) == replica]
                names |= {replica_name(p) for p in pods}
                for pod in pods:
                    key = f"{pod['metadata'].get('uid') or pod['metadata']['name']}/{_restarts(pod)}"
                    if key not in streams and _started(pod):
                        streams.add(key)
                        threading.Thread(target=pump, args=(pod,), daemon=True).start()
                        running += 1
                try:
                    ended = self.describe(name).terminal
                except NotFound:  # deleted (cancelled) while we followed it
                    ended = True
                if ended:
                    ended_at = time.monotonic()
            deadline = time.monotonic() + _LOG_POLL_S
            while True:
                try:
                    tag, line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if line is None:
                    running -= 1
                    continue
                yield f"[{tag}] {line}" if replica is None and len(names) > 1 else line
            # Service replicas (ps) may outlive a finished job: stop following them after a grace.
            if ended_at is not None and (running <= 0 or time.monotonic() - ended_at > _LOG_GRACE_S):
                return

    def wait(self, name: str, timeout_s: Optional[float] = None) -> JobDescription:
        """The base's wait, then, once the job has its verdict, the roles still running are
        stopped (ps and evaluator never end by themselves; nor do workers once the chief has
        decided), as the local supervisor and Kubeflow's cleanPodPolicy do: they hold GPUs."""
        final = super().wait(name, timeout_s)
        if self.target == "kubernetes" and final.status in (Phase.SUCCEEDED, Phase.FAILED):
            stopped = self.wind_down(name)
            if stopped:  # described again: the verdict, without the "still running" note
                final = self.describe(name)
                final = replace(final, message=f"{final.message}; stopped {', '.join(stopped)}, still running")
        return final

    def wind_down(self, name: str) -> List[str]:
        """Delete the role Jobs of `name` still running; the finished ones stay for their logs."""
        api, ns = self.api(), self._ns()
        stopped = []
        for job in unfinished(api.jobs(ns, f"{JOB_LABEL}={name}")):
            api.delete("Job", ns, job["metadata"]["name"])
            stopped.append(str((job["metadata"].get("labels") or {}).get(ROLE_LABEL, job["metadata"]["name"])))
        return stopped

    # --- cancel ----------------------------------------------------------------
    def cancel(self, name: str) -> str:
        api, ns = self.api(), self._ns()
        if self.target == "kubeflow":
            found = self._kubeflow_object(name)
            if found is None:
                raise NotFound(f"no TFJob or PyTorchJob named {name!r} in namespace {ns}")
            api.delete(found[0], ns, name)
            return f"{found[0]} {name} deleted (pods terminate, their GPU shares return to the pool)"
        selector = f"{JOB_LABEL}={name}"
        jobs, services = api.jobs(ns, selector), api.services(ns, selector)
        if not jobs and not services:
            raise NotFound(f"no job named {name!r} in namespace {ns}")
        for obj in jobs:
            api.delete("Job", ns, obj["metadata"]["name"])
        for obj in services:
            api.delete("Service", ns, obj["metadata"]["name"])
        return (
            f"job {name} deleted: {len(jobs)} Job(s), {len(services)} Service(s) "
            "(pods terminate, their GPU shares return to the pool)"
        )


def _check_replica(name: str, replica: Optional[str], pods: List[Obj]) -> None:
    known = sorted({replica_name(p) for p in pods})
    if replica is not None and known and replica not in known:
        raise InvalidInput(f"job {name!r} has no replica {replica!r}: use one of {', '.join(known)}")


def _restarts(pod: Obj) -> int:
    return sum(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])


def _container(pod: Obj) -> str:
    return str(((pod.get("spec") or {}).get("containers") or [{}])[0].get("name", ""))


def _started(pod: Obj) -> bool:
    """Whether the replica's container has a log to read (it runs or ran)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        state = status.get("state") or {}
        if "running" in state or "terminated" in state or status.get("lastState", {}).get("terminated"):
            return True
    return False
