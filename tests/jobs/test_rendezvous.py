"""Rendezvous env per framework, against the layouts TensorFlow, torchrun and Horovod document."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from gpupool.jobs.manifests.indexed import indexed_job
from gpupool.jobs.plan import gang_claim, local_endpoints, replicas
from gpupool.jobs.rendezvous import horovod_env, hostfile, rendezvous_env, tf_config, torch_env
from gpupool.jobs.rendezvous.kvstore import MAX_BODY_BYTES, TOKEN_ENV, KVStoreServer
from gpupool.jobs.spec import parse_spec


def tf_spec(**roles):
    return parse_spec({"name": "tf", "framework": "tensorflow", "roles": roles})


def test_tf_config_ps_layout():
    spec = tf_spec(
        chief={"command": ["c"]},
        worker={"replicas": 2, "command": ["w"]},
        ps={"replicas": 1, "command": ["p"]},
        evaluator={"command": ["e"]},
    )
    reps = replicas(spec)
    ep = local_endpoints(reps, [2000, 2001, 2002, 2003, 2004])
    configs = {r.name: tf_config(reps, ep, r) for r in reps}
    cluster = {"chief": ["127.0.0.1:2000"], "worker": ["127.0.0.1:2001", "127.0.0.1:2002"], "ps": ["127.0.0.1:2003"]}
    for _name, cfg in configs.items():
        assert cfg["cluster"] == cluster  # the same cluster in every process, evaluator left out
    assert configs["chief-0"]["task"] == {"type": "chief", "index": 0}
    assert configs["worker-1"]["task"] == {"type": "worker", "index": 1}
    assert configs["ps-0"]["task"] == {"type": "ps", "index": 0}
    assert configs["evaluator-0"]["task"] == {"type": "evaluator", "index": 0}
    env = rendezvous_env(spec, reps, ep, reps[1])
    assert json.loads(env["TF_CONFIG"]) == configs["worker-0"]


def test_tf_config_mwms_has_no_chief():
    spec = tf_spec(worker={"replicas": 2, "command": ["w"]})
    reps = replicas(spec)
    cfg = tf_config(reps, local_endpoints(reps, [3000, 3001]), reps[0])
    assert cfg == {"cluster": {"worker": ["127.0.0.1:3000", "127.0.0.1:3001"]}, "task": {"type": "worker", "index": 0}}


def test_torch_env_master_and_workers():
    spec = parse_spec(
        {
            "name": "pt",
            "framework": "pytorch",
            "roles": {"master": {"command": ["m"]}, "worker": {"replicas": 2, "command": ["w"]}},
        }
    )
    reps = replicas(spec)
    ep = local_endpoints(reps, [4000, 4001, 4002])
    envs = [torch_env(reps, ep, r) for r in reps]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    for e in envs:
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == "4000"
        assert e["WORLD_SIZE"] == "3" and e["LOCAL_RANK"] == "0" and e["LOCAL_WORLD_SIZE"] == "1"
        assert e["PET_NNODES"] == "3" and e["PET_NPROC_PER_NODE"] == "1"
        assert e["PET_MASTER_ADDR"] == e["MASTER_ADDR"] and e["PET_MASTER_PORT"] == e["MASTER_PORT"]
        assert e["PET_NODE_RANK"] == e["RANK"] == e["GROUP_RANK"]
    assert envs[2]["ROLE_NAME"] == "worker" and envs[2]["ROLE_RANK"] == "1" and envs[2]["ROLE_WORLD_SIZE"] == "2"


def test_horovod_env_and_hostfile():
    spec = parse_spec({"name": "hvd", "framework": "horovod", "roles": {"worker": {"replicas": 3, "command": ["w"]}}})
    reps = replicas(spec)
    ep = local_endpoints(reps, [5000, 5001, 5002])
    with pytest.raises(ValueError):
        horovod_env(reps, ep, reps[0])
    ep = type(ep)(ep.hosts, ep.ports, ("127.0.0.1", 5999))
    env = horovod_env(reps, ep, reps[2])
    assert env["HOROVOD_RANK"] == "2" and env["HOROVOD_SIZE"] == "3"
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1" and env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "5999"
    assert env["HOROVOD_CONTROLLER"] == env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert env["HOROVOD_LOCAL_RANK"] == "0" and env["HOROVOD_CROSS_RANK"] == "2" and env["HOROVOD_CROSS_SIZE"] == "3"
    assert hostfile(reps, ep) == "127.0.0.1 slots=1\n" * 3


def test_kvstore_put_get_delete():
    server = KVStoreServer().start()
    try:
        base = f"http://127.0.0.1:{server.port}/{server.token}/global"
        assert _status(base + "/rank0") == 404
        assert _status(base + "/rank0", b"addr", "PUT") == 200
        assert _body(base + "/rank0") == b"addr"
        assert _status(base, method="DELETE") == 200
        assert _status(base + "/rank0") == 404  # the scope is gone
    finally:
        server.stop()


def _body(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def _status(url, data=None, method="GET"):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        with err:
            return err.code


def test_kvstore_binds_loopback_and_refuses_without_the_token():
    server = KVStoreServer().start()
    try:
        assert server.server_address[0] == "127.0.0.1"
        other = KVStoreServer()
        other.server_close()
        assert len(server.token) >= 32 and other.token != server.token  # random per store
        good = f"http://127.0.0.1:{server.port}/{server.token}/global/rank0"
        assert _status(good, b"secret-addr", "PUT") == 200
        for path in ("global/rank0", f"{server.token[:-1]}x/global/rank0", f"x{server.token}/global/rank0", ""):
            url = f"http://127.0.0.1:{server.port}/{path}"
            assert _status(url) == 401, path
            assert _status(url, b"forged", "PUT") == 401, path
            assert _status(url, method="DELETE") == 401, path
        assert _body(good) == b"secret-addr"  # nothing above overwrote or dropped it
    finally:
        server.stop()


def test_kvstore_refuses_an_oversize_body():
    server = KVStoreServer().start()
    try:
        url = f"http://127.0.0.1:{server.port}/{server.token}/global/big"
        # refused from its Content-Length, before any of the body is read
        for length in (MAX_BODY_BYTES + 1, 99999999999):
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                head = f"PUT /{server.token}/global/big HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
                sock.sendall(head.encode() + b"x" * 1000)
                assert sock.recv(100).startswith(b"HTTP/1.0 413"), length
        assert _status(url) == 404  # not stored
        assert _status(url, b"x" * MAX_BODY_BYTES, "PUT") == 200
        assert len(_body(url)) == MAX_BODY_BYTES
    finally:
        server.stop()


def test_horovod_env_carries_the_token_the_way_horovod_builds_its_urls():
    """Horovod's gloo store asks http://{ADDR}:{PORT}/{scope}/{key}: that URL reaches the store with the token."""
    spec = parse_spec({"name": "hvd", "framework": "horovod", "roles": {"worker": {"replicas": 2, "command": ["w"]}}})
    reps = replicas(spec)
    server = KVStoreServer().start()
    try:
        base = local_endpoints(reps, [5000, 5001])
        ep = type(base)(base.hosts, base.ports, ("127.0.0.1", server.port), server.token)
        envs = [horovod_env(reps, ep, r) for r in reps]
        for env in envs:
            assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == f"127.0.0.1:{server.port}/{server.token}"
            assert env[TOKEN_ENV] == server.token
        e0, e1 = envs
        url0 = f"http://{e0['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{e0['HOROVOD_GLOO_RENDEZVOUS_PORT']}/global/0"
        url1 = f"http://{e1['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{e1['HOROVOD_GLOO_RENDEZVOUS_PORT']}/global/0"
        assert _status(url0, b"rank0-addr", "PUT") == 200
        assert _body(url1) == b"rank0-addr"  # rank 1 reads what rank 0 wrote
        forged = f"http://127.0.0.1:{server.port}/global/0"  # the URL a stock env without the token gives
        assert _status(forged) == 401
    finally:
        server.stop()


def test_kvstore_process_refuses_to_start_without_a_token():
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    cmd = [sys.executable, "-m", "gpupool.jobs.rendezvous.kvstore", "--port", "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and TOKEN_ENV in out.stderr and "Traceback" not in out.stderr


def test_gang_claim_skips_replicas_without_gpu():
    spec = tf_spec(worker={"replicas": 2, "command": ["w"], "gpu": {"fraction": 0.5}}, ps={"command": ["p"]})
    claim = gang_claim(spec)
    assert len(claim.requests) == 2
    reps = replicas(spec)
    assert [r.group for r in reps] == [0, 1, None]
    assert gang_claim(tf_spec(worker={"command": ["w"]})) is None


def test_kubernetes_horovod_pods_get_the_token_from_their_job():
    """On Kubernetes the token is the worker Job's UID (a label on each of its pods), defined
    before the Horovod address that names it; worker 0 serves the store with it on the pod's network."""
    spec = parse_spec({"name": "h", "framework": "horovod", "roles": {"worker": {"replicas": 2, "command": ["x"]}}})
    job = indexed_job(spec, spec.roles[0], 0)
    container = job["spec"]["template"]["spec"]["containers"][0]
    names = [e["name"] for e in container["env"]]
    token = container["env"][names.index(TOKEN_ENV)]
    assert token["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['batch.kubernetes.io/controller-uid']"
    addr = container["env"][names.index("HOROVOD_GLOO_RENDEZVOUS_ADDR")]["value"]
    assert addr == f"h-worker-0.h:29400/$({TOKEN_ENV})"
    assert names.index(TOKEN_ENV) < names.index("HOROVOD_GLOO_RENDEZVOUS_ADDR")  # $(VAR) sees only earlier ones
    assert "kvstore --host 0.0.0.0 --port 29400" in " ".join(container["command"])


def test_kvstore_cuts_a_stalled_caller():
    server = KVStoreServer(idle_timeout_s=0.5).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            sock.sendall(f"PUT /{server.token}/global/k HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345".encode())
            started = time.monotonic()
            assert sock.recv(100) == b""  # closed without an answer, the half body never stored
            assert time.monotonic() - started < 20  # by its 0.5 s idle timer, not the default 30 s
        assert _status(f"http://127.0.0.1:{server.port}/{server.token}/global/k") == 404
    finally:
        server.stop()
