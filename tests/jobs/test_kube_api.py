"""JobApi, the executor's I/O, through the real kubernetes client against a stand-in API server
on loopback (HTTP, the paths and JSON the API serves): models are read back to the API's
JSON, errors become gpupool's, logs stream, and a dead server is ServerUnreachable."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Tuple

import pytest
from waiting import wait_until

from gpupool.core.errors import NotFound, ServerUnreachable
from gpupool.jobs.executors.kubernetes import KubernetesExecutor
from gpupool.jobs.phase import Phase
from gpupool.jobs.spec import parse_spec

from .kube_fake import FakeCluster, job_condition, running, terminated

pytest.importorskip("kubernetes")

SPEC = {
    "name": "ddp",
    "framework": "pytorch",
    "image": "ghcr.io/gpupool/gpupool-examples:0.1.0-pytorch",
    "roles": {"worker": {"replicas": 2, "command": ["python", "t.py"], "gpu": {"fraction": 0.5}}},
}
PLURAL_KINDS = {"jobs": "Job", "pods": "Pod", "services": "Service", "tfjobs": "TFJob", "pytorchjobs": "PyTorchJob"}


def status(code: int, reason: str, message: str) -> Dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiServer:
    """Serves a FakeCluster's objects at the API's paths, as JSON lists, objects and Status errors."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.requests: List[Tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: Any, content_type: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                outer.handle(self, "GET")

            def do_POST(self) -> None:
                outer.handle(self, "POST")

            def do_DELETE(self) -> None:
                outer.handle(self, "DELETE")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def handle(self, h: Any, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        self.requests.append((method, h.path))
        if url.path.rstrip("/") == "/version":
            version = {
                "major": "1",
                "minor": "29",
                "gitVersion": self.cluster.version,
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2026-04-16T18:14:29Z",
                "goVersion": "go1.22.2",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
            return h._answer(200, version)
        ns = parts[parts.index("namespaces") + 1]
        rest = parts[parts.index("namespaces") + 2 :]
        plural, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        kind = PLURAL_KINDS[plural]
        if method == "POST":
            length = int(h.headers["Content-Length"])
            obj = json.loads(h.rfile.read(length))
            self.cluster.create(obj)
            return h._answer(201, self.cluster.objects[(kind, ns, obj["metadata"]["name"])])
        if method == "DELETE":
            try:
                self.cluster.delete(kind, ns, name)
            except NotFound:
                return h._answer(404, status(404, "NotFound", f'{plural} "{name}" not found'))
            # what the API answers: the object, marked, while the foreground finalizer runs
            return h._answer(200, self.cluster.objects[(kind, ns, name)])
        if sub == "log":
            lines = self.cluster.logs.get(name, [])
            return h._answer(200, "".join(line + "\n" for line in lines).encode(), "text/plain")
        if name is not None:
            obj = self.cluster.objects.get((kind, ns, name))
            if obj is None or (plural in ("tfjobs", "pytorchjobs") and plural not in self.cluster.crds):
                return h._answer(404, status(404, "NotFound", f'{plural}.kubeflow.org "{name}" not found'))
            return h._answer(200, obj)
        selector = query.get("labelSelector", "")
        items = self.cluster._list(kind, ns, selector)
        version = "batch/v1" if kind == "Job" else "v1"
        return h._answer(
            200, {"kind": f"{kind}List", "apiVersion": version, "metadata": {"resourceVersion": "9"}, "items": items}
        )

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture
def api(tmp_path, monkeypatch):
    cluster = FakeCluster()
    server = ApiServer(cluster)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stand-in", "cluster": {"server": server.url}}],
        "users": [{"name": "u", "user": {"token": "t0k3n"}}],
        "contexts": [{"name": "c", "context": {"cluster": "stand-in", "user": "u", "namespace": "default"}}],
        "current-context": "c",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(path))
    yield cluster, server
    server.close()


def test_submit_describe_logs_and_cancel_through_the_kubernetes_client(api, monkeypatch):
    from gpupool.jobs.executors import kubernetes

    monkeypatch.setattr(kubernetes, "_LOG_POLL_S", 0.05)
    cluster, server = api
    cluster.version = "v1.29.4"
    ex = KubernetesExecutor("kubernetes")
    ex.poll_s = 0.0
    assert ex.schedule(ex.dryrun(parse_spec(SPEC))) == "ddp"
    assert any(path.startswith("/version") for _, path in server.requests)
    assert "successPolicy" not in cluster.job("ddp-worker")["spec"]  # rendered for the server's 1.29
    pods = cluster.start_indexed("ddp-worker")
    for i, p in enumerate(pods):
        running(cluster.pod(p))
        cluster.logs[p] = [f"rank {i} step 1"]
    d = ex.describe("ddp")
    assert d.status is Phase.RUNNING and [r.name for r in d.replicas] == ["worker-0", "worker-1"]
    assert d.submitted_at is not None and d.started_at is not None  # timestamps survive the client's models
    assert list(ex.log_lines("ddp", "worker-1")) == ["rank 1 step 1"]
    terminated(cluster.pod(pods[0]), 0)
    job_condition(cluster.job("ddp-worker"), "Complete")
    assert ex.wait("ddp").status is Phase.SUCCEEDED
    followed = sorted(ex.log_lines("ddp", follow=True))  # streamed (chunked reads), every replica
    assert followed == ["[worker-0] rank 0 step 1", "[worker-1] rank 1 step 1"]
    assert [j.name for j in ex.list()] == ["ddp"]
    assert "1 Job(s), 1 Service(s)" in ex.cancel("ddp")
    assert ("Job", "ddp-worker") in cluster.deleted


def test_kubeflow_kind_missing_and_api_errors(api):
    cluster, _ = api
    ex = KubernetesExecutor("kubeflow")
    with pytest.raises(NotFound, match="no TFJob or PyTorchJob named 'nope'"):
        ex.describe("nope")
    ex.schedule(ex.dryrun(parse_spec(SPEC)))
    assert ("PyTorchJob", "default", "ddp") in cluster.objects
    assert ex.describe("ddp").status is Phase.PENDING


def test_a_dead_api_server_is_unreachable(api):
    _, server = api
    server.close()
    server.httpd.server_close()
    ex = KubernetesExecutor("kubernetes")
    with pytest.raises(ServerUnreachable, match="unreachable"):
        ex.describe("ddp")


def test_cli_submit_follow_waits_for_the_job_to_end(api, monkeypatch, tmp_path, capsys):
    """`gpupool submit job.yaml --target kubernetes --follow`: streams the logs, returns when the
    job has ended, with its outcome as the exit code."""
    import yaml

    from gpupool.cli.main import main
    from gpupool.jobs.executors import kubernetes

    monkeypatch.setattr(kubernetes, "_LOG_POLL_S", 0.05)
    monkeypatch.setattr(KubernetesExecutor, "poll_s", 0.05)
    cluster, server = api
    path = tmp_path / "ddp.yaml"
    path.write_text(yaml.safe_dump(SPEC))

    def cluster_runs_the_job() -> None:
        wait_until(lambda: ("Job", "default", "ddp-worker") in cluster.objects, 60, "the CLI to create the Job")
        pods = cluster.start_indexed("ddp-worker")
        for i, p in enumerate(pods):
            cluster.logs[p] = [f"rank {i} done"]
            running(cluster.pod(p))
        wait_until(
            lambda: all(
                any(asked.split("?")[0].endswith(f"/pods/{p}/log") for _, asked in server.requests) for p in pods
            ),
            60,
            "the CLI to follow the running job's logs",
        )
        for p in pods:
            terminated(cluster.pod(p), 0)
        job_condition(cluster.job("ddp-worker"), "Complete")

    worker = threading.Thread(target=cluster_runs_the_job)
    worker.start()
    code = main(["submit", str(path), "--target", "kubernetes", "--follow"])
    worker.join(5)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "[worker-0] rank 0 done" in out.out and "job ddp succeeded" in out.err
