"""Port reservations never collide between jobs and are reused once a job is gone."""

import socket

from gpupool.jobs.executors.local import ports


def test_two_jobs_never_share_ports(tmp_path):
    a = ports.reserve(tmp_path, "a", 20)
    b = ports.reserve(tmp_path, "b", 20)
    assert len(set(a)) == 20 and not set(a) & set(b)
    assert all(ports.PORT_RANGE[0] <= p < ports.PORT_RANGE[1] for p in a + b)
    assert set(ports.reserved(tmp_path)) == set(a) | set(b)


def test_dead_jobs_are_dropped_and_release(tmp_path):
    a = ports.reserve(tmp_path, "a", 3)
    ports.reserve(tmp_path, "b", 1, is_live=lambda job: job != "a")
    assert not set(a) & set(ports.reserved(tmp_path))
    ports.release(tmp_path, "b")
    assert ports.reserved(tmp_path) == {}


def test_busy_port_is_skipped(tmp_path, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        busy = s.getsockname()[1]
        s.listen()
        assert not ports._bindable(busy, "127.0.0.1")
