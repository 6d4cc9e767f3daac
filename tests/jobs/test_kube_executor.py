"""The Kubernetes executor over a stand-in API server: list, describe, wait, cancel and logs of
Indexed Jobs and of TFJob/PyTorchJob, read from objects shaped as the API serves them."""

from __future__ import annotations

import pytest

from gpupool.cli.jobs import follow_to_end
from gpupool.core.errors import InvalidInput, NotFound, Unavailable
from gpupool.jobs.executors import kubernetes as kube_executor
from gpupool.jobs.executors.kube_status import describe_kubeflow, pod_phase, replica_name
from gpupool.jobs.executors.kubernetes import KubernetesExecutor, api_error
from gpupool.jobs.phase import Phase
from gpupool.jobs.spec import parse_spec

from .kube_fake import (
    FakeCluster,
    crash_looping,
    image_pull_backoff,
    job_condition,
    kubeflow_condition,
    running,
    terminated,
    unschedulable,
)

IMAGE = "ghcr.io/gpupool/gpupool:0.1.0"
DDP = {
    "name": "ddp",
    "framework": "pytorch",
    "image": IMAGE,
    "restartPolicy": "Never",
    "backoffLimit": 2,
    "roles": {"worker": {"replicas": 2, "command": ["python", "t.py"], "gpu": {"fraction": 0.5}}},
}
PT = {
    "name": "pt",
    "framework": "pytorch",
    "image": IMAGE,
    "restartPolicy": "OnFailure",
    "successPolicy": "allWorkers",
    "roles": {
        "master": {"command": ["python", "t.py"], "gpu": {"fraction": 0.5}},
        "worker": {"replicas": 2, "command": ["python", "t.py"], "gpu": {"fraction": 0.5}},
    },
}
TF_PS = {
    "name": "tfps",
    "framework": "tensorflow",
    "image": IMAGE,
    "restartPolicy": "ExitCode",
    "roles": {
        "chief": {"command": ["python", "t.py"]},
        "worker": {"replicas": 2, "command": ["python", "t.py"], "gpu": {"fraction": 0.25}},
        "ps": {"command": ["python", "t.py"]},
    },
}


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setattr(kube_executor, "_LOG_POLL_S", 0.01)
    monkeypatch.setattr(kube_executor, "_LOG_GRACE_S", 0.2)
    return FakeCluster()


def submit(cluster, data, target="kubernetes"):
    ex = KubernetesExecutor(target, api=cluster)
    ex.poll_s = 0.0
    ex.schedule(ex.dryrun(parse_spec(data)))
    return ex


def check_shapes(cluster, version="1.33"):
    """Every Job, Pod and Service of the stand-in passes Kubernetes' own schema, status included."""
    kv = pytest.importorskip("kubernetes_validate")
    for (kind, _, name), obj in cluster.objects.items():
        if kind in ("Job", "Pod", "Service"):
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as err:
                raise AssertionError(f"{kind} {name}: {str(err).splitlines()[0]}") from None


# --- Indexed Jobs --------------------------------------------------------------------------


def test_pending_says_why(cluster):
    ex = submit(cluster, DDP)
    d = ex.describe("ddp")
    assert d.status is Phase.PENDING and d.message == "no pods yet" and not d.terminal
    first, second = cluster.start_indexed("ddp-worker")
    unschedulable(cluster.pod(first), "0/3 nodes are available: 3 Insufficient gpupool.io/gpu.")
    image_pull_backoff(cluster.pod(second))
    check_shapes(cluster)
    d = ex.describe("ddp")
    assert d.status is Phase.PENDING
    assert [r.name for r in d.replicas] == ["worker-0", "worker-1"]
    assert "worker-0: Unschedulable: 0/3 nodes are available" in d.message
    assert "worker-1: ImagePullBackOff" in d.message
    assert d.submitted_at is not None and d.started_at is not None


def test_running_then_chief_success_policy(cluster):
    ex = submit(cluster, DDP)
    pods = cluster.start_indexed("ddp-worker")
    for p in pods:
        running(cluster.pod(p))
    d = ex.describe("ddp")
    assert d.status is Phase.RUNNING and {r.status for r in d.replicas} == {Phase.RUNNING}
    assert d.replicas[0].devices == "node gpu-node-1"
    # Worker 0 ends: the Job's successPolicy (index 0) is met while worker 1 still stops.
    terminated(cluster.pod(pods[0]), 0)
    job_condition(cluster.job("ddp-worker"), "SuccessCriteriaMet", "SuccessPolicy", "Matched rules at index 0")
    check_shapes(cluster)
    d = ex.describe("ddp")
    assert d.status is Phase.SUCCEEDED and d.terminal and d.message == "worker completed"
    assert d.replicas[0].status is Phase.SUCCEEDED and d.replicas[0].exit_code == 0


def test_all_workers_policy_waits_for_every_role(cluster):
    ex = submit(cluster, PT)
    assert {o["metadata"]["name"] for o in cluster.jobs("default", "")} == {"pt-master", "pt-worker"}
    for job in ("pt-master", "pt-worker"):
        for p in cluster.start_indexed(job):
            running(cluster.pod(p))
    for p in ("pt-master-0-ax7k2",):
        terminated(cluster.pod(p), 0)
    job_condition(cluster.job("pt-master"), "Complete")
    d = ex.describe("pt")
    assert d.status is Phase.RUNNING  # allWorkers: the master alone is not enough
    assert [r.name for r in d.replicas] == ["master-0", "worker-0", "worker-1"]
    job_condition(cluster.job("pt-worker"), "Complete")
    d = ex.describe("pt")
    assert d.status is Phase.SUCCEEDED and d.message == "all workers completed" and d.finished_at


def test_pod_failure_policy_fails_the_job_with_the_reason(cluster):
    ex = submit(cluster, TF_PS)
    for job in ("tfps-chief", "tfps-worker", "tfps-ps"):
        for p in cluster.start_indexed(job):
            running(cluster.pod(p))
    terminated(cluster.pod("tfps-worker-1-ax7k2"), 3)
    message = (
        "Container worker for pod default/tfps-worker-1-ax7k2 failed with exit code 3 matching FailJob rule at index 0"
    )
    job_condition(cluster.job("tfps-worker"), "FailureTarget", "PodFailurePolicy", message)
    check_shapes(cluster)
    assert ex.describe("tfps").message.endswith("; chief, ps still running: gpupool cancel tfps stops them")
    d = ex.wait("tfps", timeout_s=1)
    assert d.status is Phase.FAILED
    assert d.message == f"worker: PodFailurePolicy: {message}; stopped chief, ps, still running"
    assert sorted(cluster.deleted) == [("Job", "tfps-chief"), ("Job", "tfps-ps")]
    worker1 = next(r for r in d.replicas if r.name == "worker-1")
    assert worker1.status is Phase.FAILED and worker1.exit_code == 3
    assert [r.name for r in d.replicas] == ["chief-0", "worker-0", "worker-1", "ps-0"]


def test_chief_success_winds_down_servers_and_workers(cluster):
    """ParameterServerStrategy: the chief ends the job; ps and workers are servers that never
    end by themselves, and hold GPUs, so wait() stops them; a later describe keeps the verdict."""
    ex = submit(cluster, TF_PS)
    for job in ("tfps-chief", "tfps-worker", "tfps-ps"):
        for p in cluster.start_indexed(job):
            running(cluster.pod(p))
    terminated(cluster.pod("tfps-chief-0-ax7k2"), 0)
    job_condition(cluster.job("tfps-chief"), "Complete")
    d = ex.wait("tfps")
    assert d.status is Phase.SUCCEEDED
    assert d.message == "chief completed; stopped ps, worker, still running"
    assert sorted(cluster.deleted) == [("Job", "tfps-ps"), ("Job", "tfps-worker")]
    assert ex.describe("tfps").status is Phase.SUCCEEDED  # not "cancelled" while they are deleted


def test_retries_and_crash_loops_count_as_restarts(cluster):
    ex = submit(cluster, DDP)
    first, second = cluster.start_indexed("ddp-worker")
    running(cluster.pod(first))
    terminated(cluster.pod(second), 137)
    retry = cluster.retry_index("ddp-worker", 1)  # restartPolicy Never: the Job makes a new pod
    running(cluster.pod(retry))
    d = ex.describe("ddp")
    worker1 = d.replicas[1]
    assert (worker1.name, worker1.status, worker1.restarts) == ("worker-1", Phase.RUNNING, 1)
    assert d.restarts == 1 and d.status is Phase.RUNNING
    crash_looping(cluster.pod(first), restarts=2, last_exit=1)
    check_shapes(cluster)
    d = ex.describe("ddp")
    assert d.status is Phase.RESTARTING and d.replicas[0].restarts == 2 and d.replicas[0].exit_code == 1
    assert "CrashLoopBackOff" in d.message


def test_suspended_job_is_pending(cluster):
    ex = submit(cluster, DDP)
    job_condition(cluster.job("ddp-worker"), "Suspended", "JobSuspended", "Job suspended")
    d = ex.describe("ddp")
    assert d.status is Phase.PENDING and d.message == "suspended: worker"


def test_list_and_unknown_names(cluster):
    submit(cluster, DDP)
    ex = submit(cluster, PT)
    assert [d.name for d in ex.list()] == ["ddp", "pt"]
    with pytest.raises(NotFound, match="no job named 'nope'"):
        ex.describe("nope")
    with pytest.raises(NotFound):
        ex.cancel("nope")


def test_cancel_deletes_jobs_and_service_and_wait_sees_it(cluster):
    ex = submit(cluster, PT)
    for p in cluster.start_indexed("pt-worker"):
        running(cluster.pod(p))
    out = ex.cancel("pt")
    assert "2 Job(s), 1 Service(s)" in out
    assert sorted(cluster.deleted) == [("Job", "pt-master"), ("Job", "pt-worker"), ("Service", "pt")]
    assert ex.describe("pt").status is Phase.CANCELLED  # foreground deletion under way
    for key in [k for k in cluster.objects if k[0] in ("Job", "Pod")]:
        cluster.remove(*key)
    with pytest.raises(NotFound):
        ex.describe("pt")


def test_wait_polls_describe_until_terminal(cluster):
    ex = submit(cluster, DDP)
    pods = cluster.start_indexed("ddp-worker")
    seen = []
    real = ex.describe

    def describe(name):
        seen.append(1)
        if len(seen) == 3:
            terminated(cluster.pod(pods[0]), 0)
            job_condition(cluster.job("ddp-worker"), "Complete")
        return real(name)

    ex.describe = describe  # type: ignore[method-assign]
    assert ex.wait("ddp").status is Phase.SUCCEEDED and len(seen) == 3
    with pytest.raises(Unavailable, match="still"):
        submit(cluster, PT).wait("pt", timeout_s=0.0)


def test_wait_after_deletion_from_elsewhere_is_cancelled(cluster):
    ex = submit(cluster, DDP)
    calls = []
    real = ex.describe

    def describe(name):
        calls.append(1)
        if len(calls) == 2:
            for key in [k for k in cluster.objects if k[0] in ("Job", "Pod", "Service")]:
                cluster.remove(*key)
        return real(name)

    ex.describe = describe  # type: ignore[method-assign]
    d = ex.wait("ddp")
    assert d.status is Phase.CANCELLED and d.message == "deleted"


# --- logs -------------------------------------------------------------------------------


def test_logs_of_every_replica_one_replica_and_unknown(cluster):
    ex = submit(cluster, DDP)
    pods = cluster.start_indexed("ddp-worker")
    for i, p in enumerate(pods):
        running(cluster.pod(p))
        cluster.logs[p] = [f"step 1 rank {i}", f"step 2 rank {i}"]
    assert list(ex.log_lines("ddp")) == [
        "[worker-0] step 1 rank 0",
        "[worker-0] step 2 rank 0",
        "[worker-1] step 1 rank 1",
        "[worker-1] step 2 rank 1",
    ]
    assert list(ex.log_lines("ddp", "worker-1")) == ["step 1 rank 1", "step 2 rank 1"]
    with pytest.raises(InvalidInput, match="use one of worker-0, worker-1"):
        list(ex.log_lines("ddp", "worker-7"))
    with pytest.raises(NotFound):
        list(ex.log_lines("nope"))


def test_logs_before_any_replica_started(cluster):
    ex = submit(cluster, DDP)
    cluster.start_indexed("ddp-worker")
    with pytest.raises(NotFound, match="no replica has started yet"):
        list(ex.log_lines("ddp"))


def test_follow_streams_every_replica_until_the_job_ends(cluster):
    ex = submit(cluster, DDP)
    pods = cluster.start_indexed("ddp-worker")
    for i, p in enumerate(pods):
        running(cluster.pod(p))
        cluster.logs[p] = [f"rank {i} done"]
    terminated(cluster.pod(pods[0]), 0)
    job_condition(cluster.job("ddp-worker"), "Complete")
    assert sorted(ex.log_lines("ddp", follow=True)) == ["[worker-0] rank 0 done", "[worker-1] rank 1 done"]


def test_follow_to_end_waits_and_exits_with_the_outcome(cluster, capsys):
    """`gpupool submit --target kubernetes --follow`: logs, then the job's end, then the exit code."""
    ex = submit(cluster, DDP)
    pods = cluster.start_indexed("ddp-worker")
    for p in pods:
        running(cluster.pod(p))
    cluster.logs[pods[0]] = ["epoch 1"]
    terminated(cluster.pod(pods[0]), 1)
    job_condition(
        cluster.job("ddp-worker"), "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    )
    assert follow_to_end(ex, "ddp") == 1
    out = capsys.readouterr()
    assert "epoch 1" in out.out and "job ddp failed: worker: BackoffLimitExceeded" in out.err


# --- Kubeflow ---------------------------------------------------------------------------


def test_tfjob_phases_follow_the_operator_conditions(cluster):
    ex = submit(cluster, TF_PS, "kubeflow")
    d = ex.describe("tfps")
    assert d.status is Phase.PENDING and d.message == "no pods yet"
    kubeflow_condition(cluster.objects[("TFJob", "default", "tfps")], "Created", "TFJobCreated", "created")
    pods = cluster.start_kubeflow("TFJob", "tfps")
    assert ex.describe("tfps").status is Phase.PENDING
    for p in pods:
        running(cluster.pod(p))
    tfjob = cluster.objects[("TFJob", "default", "tfps")]
    kubeflow_condition(tfjob, "Running", "TFJobRunning", "TFJob default/tfps is running.")
    check_shapes(cluster)
    d = ex.describe("tfps")
    assert d.status is Phase.RUNNING
    assert [r.name for r in d.replicas] == ["chief-0", "worker-0", "worker-1", "ps-0"]
    kubeflow_condition(
        tfjob, "Restarting", "TFJobRestarting", "TFJob tfps is restarting because 1 Worker replica(s) failed."
    )
    assert ex.describe("tfps").status is Phase.RESTARTING
    kubeflow_condition(tfjob, "Running", "TFJobRunning", "TFJob default/tfps is running.")
    terminated(cluster.pod("tfps-chief-0"), 0)
    kubeflow_condition(tfjob, "Succeeded", "TFJobSucceeded", "TFJob default/tfps successfully completed.")
    assert [c["status"] for c in tfjob["status"]["conditions"] if c["type"] == "Running"] == ["False"]
    d = ex.wait("tfps")
    assert d.status is Phase.SUCCEEDED and "successfully completed" in d.message and d.finished_at
    check_crd(tfjob)


def test_pytorchjob_of_workers_only_names_the_operator_replicas(cluster):
    ex = submit(cluster, DDP, "kubeflow")
    obj = cluster.objects[("PyTorchJob", "default", "ddp")]
    assert set(obj["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    for p in cluster.start_kubeflow("PyTorchJob", "ddp"):
        running(cluster.pod(p))
    kubeflow_condition(obj, "Running", "PyTorchJobRunning", "running")
    d = ex.describe("ddp")
    assert [r.name for r in d.replicas] == ["master-0", "worker-0"]
    kubeflow_condition(
        obj, "Failed", "PyTorchJobFailed", "PyTorchJob ddp has failed because 1 Worker replica(s) failed."
    )
    assert ex.describe("ddp").status is Phase.FAILED
    assert [d.name for d in ex.list()] == ["ddp"]
    assert "PyTorchJob ddp deleted" in ex.cancel("ddp")
    assert cluster.deleted == [("PyTorchJob", "ddp")]
    assert ex.describe("ddp").status is Phase.CANCELLED
    check_crd(obj)


def test_kubeflow_list_skips_a_missing_crd_and_unknown_names(cluster):
    ex = submit(cluster, TF_PS, "kubeflow")
    cluster.crds = {"tfjobs"}
    assert [d.name for d in ex.list()] == ["tfps"]
    with pytest.raises(NotFound, match="no TFJob or PyTorchJob named 'nope'"):
        ex.describe("nope")
    with pytest.raises(NotFound):
        ex.cancel("nope")


def test_kubeflow_replicas_from_replica_statuses_when_pods_are_gone():
    obj = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "t", "namespace": "default", "creationTimestamp": "2026-11-23T10:00:00Z"},
        "status": {
            "replicaStatuses": {"Chief": {"succeeded": 1}, "Worker": {"succeeded": 1, "failed": 1}},
            "conditions": [],
        },
    }
    kubeflow_condition(obj, "Succeeded", "TFJobSucceeded", "done")
    d = describe_kubeflow("t", obj, [])
    assert [(r.name, r.status) for r in d.replicas] == [
        ("chief-0", Phase.SUCCEEDED),
        ("worker-0", Phase.SUCCEEDED),
        ("worker-1", Phase.FAILED),
    ]


def check_crd(obj):
    """The object, status included, passes the training operator's own CRD schema when its
    files are at hand (tests/jobs/crds.py; test_manifests_versions.py skips visibly without)."""
    from .crds import crd_folder, validate_custom

    if crd_folder() is not None:
        validate_custom(obj)


# --- small rules -------------------------------------------------------------------------


def test_pod_phase_of_a_pod_being_deleted_and_of_an_evicted_pod():
    pod = {"metadata": {"deletionTimestamp": "2026-11-23T10:30:00Z"}, "spec": {}, "status": {"phase": "Running"}}
    assert pod_phase(pod) == (Phase.STOPPED, "pod is being deleted")
    evicted = {
        "metadata": {},
        "spec": {},
        "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
    }
    assert pod_phase(evicted) == (Phase.FAILED, "Evicted: The node was low on resource: memory.")
    assert replica_name({"metadata": {"labels": {}, "annotations": {}}}) == "replica-0"


def test_api_errors_become_gpupool_errors():
    body = '{"kind":"Status","apiVersion":"v1","status":"Failure","message":"jobs.batch \\"x\\" is forbidden","reason":"Forbidden","code":403}'
    err = api_error("create Job default/x", 403, "Forbidden", body)
    assert err.code == "forbidden" and 'jobs.batch "x" is forbidden' in err.message and "RBAC" in err.message
    assert isinstance(api_error("get", 404, "Not Found", None), NotFound)
    assert isinstance(api_error("create", 409, "Conflict", "{}"), InvalidInput)


def test_schedule_renders_for_the_api_servers_version(cluster):
    cluster.version = "v1.29.4"
    submit(cluster, DDP)
    assert "successPolicy" not in cluster.job("ddp-worker")["spec"]
    newer = FakeCluster()
    newer.version = "v1.29.4"
    ex = KubernetesExecutor("kubernetes", api=newer, kube_version="1.31")  # what the user asked for wins
    ex.schedule(ex.dryrun(parse_spec(DDP)))
    assert newer.job("ddp-worker")["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
