"""Run jobs on Kubernetes: Indexed Jobs + headless Service, or Kubeflow TFJob/PyTorchJob.

Rendering is pure (jobs/manifests/); this module is the thin layer over the
kubernetes client: create, read pod state and logs, delete. Kubernetes does
the supervising (restarts, deadline), the gpupool webhook and node agent do
the GPU shares.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

import yaml

from ...core.errors import GpupoolError, InvalidInput, NotFound
from ..manifests import render_indexed, render_kubeflow
from ..manifests.indexed import JOB_LABEL, ROLE_LABEL
from ..spec import JobSpec
from .base import DryRunInfo, Executor, JobDescription, ReplicaDescription

_PLURALS = {"TFJob": "tfjobs", "PyTorchJob": "pytorchjobs"}


class KubernetesExecutor(Executor):
    """`flavour` "kubernetes" (native Indexed Jobs) or "kubeflow" (training-operator kinds)."""

    def __init__(self, flavour: str = "kubernetes", namespace: Optional[str] = None) -> None:
        self.target = flavour
        self.namespace = namespace
        self._apis: Optional[Dict[str, Any]] = None

    def render(self, spec: JobSpec) -> List[Dict[str, Any]]:
        if self.namespace:
            from dataclasses import replace

            spec = replace(spec, namespace=self.namespace)
        return render_kubeflow(spec) if self.target == "kubeflow" else render_indexed(spec)

    def dryrun(self, spec: JobSpec) -> DryRunInfo:
        manifests = self.render(spec)
        text = yaml.safe_dump_all(manifests, sort_keys=False, default_flow_style=False, width=120)
        return DryRunInfo(self.target, spec, manifests, text)

    # --- the thin API layer ------------------------------------------------------
    def api(self) -> Dict[str, Any]:
        """Clients from ~/.kube/config, or the in-cluster service account."""
        if self._apis is None:
            try:
                from kubernetes import client, config
            except ImportError:
                raise InvalidInput("--target kubernetes needs the kube extra: pip install 'gpupool[kube]'") from None
            try:
                config.load_kube_config()
            except Exception:
                try:
                    config.load_incluster_config()
                except Exception:
                    raise GpupoolError(
                        "no Kubernetes cluster configured (no ~/.kube/config, not in a pod); "
                        "use --dry-run to print the manifests"
                    ) from None
            self._apis = {"core": client.CoreV1Api(), "batch": client.BatchV1Api(), "custom": client.CustomObjectsApi()}
        return self._apis

    def schedule(self, info: DryRunInfo) -> str:
        apis = self.api()
        for obj in info.request:
            ns = obj["metadata"]["namespace"]
            kind = obj["kind"]
            if kind == "Service":
                apis["core"].create_namespaced_service(ns, obj)
            elif kind == "Job":
                apis["batch"].create_namespaced_job(ns, obj)
            else:
                apis["custom"].create_namespaced_custom_object("kubeflow.org", "v1", ns, _PLURALS[kind], obj)
        return info.spec.name

    def _ns(self) -> str:
        return self.namespace or "default"

    def _pods(self, name: str) -> List[Any]:
        pods = self.api()["core"].list_namespaced_pod(self._ns(), label_selector=f"{JOB_LABEL}={name}").items
        return sorted(pods, key=lambda p: p.metadata.name)

    def describe(self, name: str) -> JobDescription:
        jobs = self.api()["batch"].list_namespaced_job(self._ns(), label_selector=f"{JOB_LABEL}={name}").items
        pods = self._pods(name)
        if not jobs and not pods:
            raise NotFound(f"no job named {name!r} in namespace {self._ns()}")
        return describe_from(name, self.target, jobs, pods)

    def list(self) -> List[JobDescription]:
        jobs = self.api()["batch"].list_namespaced_job(self._ns(), label_selector=JOB_LABEL).items
        names = sorted({j.metadata.labels[JOB_LABEL] for j in jobs})
        return [self.describe(n) for n in names]

    def log_lines(self, name: str, replica: Optional[str] = None, follow: bool = False) -> Iterator[str]:
        pods = [p for p in self._pods(name) if replica is None or replica_name(p) == replica]
        if not pods:
            raise NotFound(f"job {name!r} has no pod{' for ' + replica if replica else ''} in {self._ns()}")
        core = self.api()["core"]
        for pod in pods:
            text = core.read_namespaced_pod_log(pod.metadata.name, self._ns(), follow=follow and len(pods) == 1)
            for line in text.splitlines():
                yield f"[{replica_name(pod)}] {line}" if replica is None and len(pods) > 1 else line

    def cancel(self, name: str) -> str:
        apis = self.api()
        ns = self._ns()
        if self.target == "kubeflow":
            for plural in _PLURALS.values():
                try:
                    apis["custom"].delete_namespaced_custom_object("kubeflow.org", "v1", ns, plural, name)
                except Exception:
                    continue
            return f"job {name} deleted"
        selector = f"{JOB_LABEL}={name}"
        for job in apis["batch"].list_namespaced_job(ns, label_selector=selector).items:
            apis["batch"].delete_namespaced_job(job.metadata.name, ns, propagation_policy="Foreground")
        for svc in apis["core"].list_namespaced_service(ns, label_selector=selector).items:
            apis["core"].delete_namespaced_service(svc.metadata.name, ns)
        return f"job {name} deleted (pods terminate, their GPU shares return to the pool)"


def replica_name(pod: Any) -> str:
    """worker-1 from the pod's role label and completion index (or the operator's labels)."""
    labels = pod.metadata.labels or {}
    role = labels.get(ROLE_LABEL) or labels.get("training.kubeflow.org/replica-type", "replica").lower()
    index = labels.get("batch.kubernetes.io/job-completion-index") or labels.get(
        "training.kubeflow.org/replica-index", "0"
    )
    return f"{role}-{index}"


def describe_from(name: str, target: str, jobs: List[Any], pods: List[Any]) -> JobDescription:
    """A JobDescription from Job objects and pods (pure: tested with client model objects)."""
    failed = [j for j in jobs if _condition(j, "Failed")]
    done = [j for j in jobs if _condition(j, "Complete") or _condition(j, "SuccessCriteriaMet")]
    if failed:
        status, message = "Failed", _condition(failed[0], "Failed") or ""
    elif jobs and len(done) == len(jobs):
        status, message = "Succeeded", ""
    elif any(p.status and p.status.phase == "Running" for p in pods):
        status, message = "Running", ""
    else:
        status, message = "Pending", ""
    reps = []
    for pod in pods:
        code = None
        restarts = 0
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            restarts += cs.restart_count or 0
            term = cs.state.terminated if cs.state else None
            if term is not None:
                code = term.exit_code
        reps.append(
            ReplicaDescription(replica_name(pod), pod.status.phase if pod.status else "Unknown", code, restarts)
        )
    return JobDescription(
        name=name, target=target, status=status, message=message, restarts=sum(r.restarts for r in reps), replicas=reps
    )


def _condition(job: Any, kind: str) -> Optional[str]:
    for c in (job.status.conditions or []) if job.status else []:
        if c.type == kind and c.status == "True":
            return c.message or c.reason or kind
    return None
