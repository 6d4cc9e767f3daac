"""train/storage.py against a real S3 API (moto's server on loopback) and the local file system."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from envs import free_port
from waiting import wait_until

from gpupool.train import storage
from gpupool.train.storage import StorageError

from .conftest import run_env


def _roundtrip(base: str) -> None:
    storage.write_bytes(storage.join(base, "a", "one.txt"), b"1")
    storage.write_bytes(storage.join(base, "a", "deep", "two.txt"), b"22")
    assert storage.read_bytes(storage.join(base, "a", "one.txt")) == b"1"
    assert storage.exists(storage.join(base, "a", "deep", "two.txt"))
    assert not storage.exists(storage.join(base, "a", "three.txt"))
    assert storage.find(storage.join(base, "a")) == ["deep/two.txt", "one.txt"]
    assert storage.listdir(storage.join(base, "a")) == ["deep", "one.txt"]
    storage.rename(storage.join(base, "a", "one.txt"), storage.join(base, "a", "uno.txt"))
    assert storage.find(storage.join(base, "a")) == ["deep/two.txt", "uno.txt"]
    storage.remove(storage.join(base, "a", "uno.txt"))
    storage.remove(storage.join(base, "a", "uno.txt"))  # a second time is fine
    with storage.open_file(storage.join(base, "a", "deep", "two.txt")) as f:
        assert f.read() == b"22"
    assert storage.listdir(storage.join(base, "nothing")) == []


def test_s3_roundtrip(s3_bucket: str) -> None:
    _roundtrip(s3_bucket + "/run")


def test_local_and_file_url_roundtrip(tmp_path: Path) -> None:
    _roundtrip(str(tmp_path / "plain"))
    _roundtrip(f"file://{tmp_path}/url")
    assert storage.local_path(f"file://{tmp_path}/x") == tmp_path / "x"


def test_put_get_and_trees(s3_bucket: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(1000))
    (src / "sub" / "b.bin").write_bytes(b"b")
    storage.put_tree(src, s3_bucket + "/tree")
    assert storage.find(s3_bucket + "/tree") == ["a.bin", "sub/b.bin"]
    storage.get_tree(s3_bucket + "/tree", tmp_path / "back")
    assert (tmp_path / "back" / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert not list((tmp_path / "back").rglob(".tmp-*"))


def test_url_helpers() -> None:
    assert storage.is_url("s3://b/k") and storage.is_remote("gs://b/k") and not storage.is_remote("file:///x")
    assert not storage.is_url("/data/digits") and not storage.is_url("relative/dir")
    assert storage.join("s3://b/run/", "checkpoints", "x.pt") == "s3://b/run/checkpoints/x.pt"
    assert storage.name("s3://b/run/") == "run"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp2://host/x", "unknown scheme 'ftp2'"),
        ("s3://no-such-bucket-here/x.txt", "the bucket does not exist"),
    ],
)
def test_bad_urls_are_one_line_errors(s3_bucket: str, url: str, words: str) -> None:
    with pytest.raises(StorageError) as err:
        storage.read_bytes(url)
    message = err.value.message
    assert url in message and words in message and "\n" not in message
    assert err.value.exit_code == 2


def test_a_missing_key_and_a_missing_bucket_on_listing(s3_bucket: str) -> None:
    with pytest.raises(StorageError, match="does not exist; check the URL"):
        storage.read_bytes(s3_bucket + "/nope.txt")
    with pytest.raises(StorageError, match="does not exist"):
        storage.find("s3://no-such-bucket-here/data")
    assert not storage.exists("s3://no-such-bucket-here/data")


def test_refused_credentials_name_the_url_and_the_fix(s3_server, monkeypatch: pytest.MonkeyPatch) -> None:
    # A second server that checks keys: moto refuses the unknown key with 403 InvalidAccessKeyId.
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=run_env({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        import s3fs

        endpoint = f"http://127.0.0.1:{port}"
        import urllib.request

        def up() -> bool:
            assert proc.poll() is None, f"the S3 stand-in exited ({proc.returncode})"
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)
                return True
            except OSError:
                return False

        wait_until(up, 60, "the S3 stand-in to answer", interval=0.2)
        for key, value in {**s3_server.env, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "refused"}.items():
            monkeypatch.setenv(key, value)
        s3fs.S3FileSystem.clear_instance_cache()
        with pytest.raises(StorageError) as err:
            storage.read_bytes("s3://some-bucket/data.bin")
        message = err.value.message
        assert "s3://some-bucket/data.bin" in message and "access refused" in message and "AWS_PROFILE" in message
        assert "\n" not in message
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        proc.kill()
        proc.wait()


_WRITER = """
import sys
from gpupool.train import storage
while True:
    storage.put_file(sys.argv[1], sys.argv[2])
"""


def test_a_writer_killed_mid_put_leaves_the_old_file_or_the_new_one(s3_bucket: str, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"N" * (24 << 20))
    target = s3_bucket + "/ckpt/latest.bin"
    storage.write_bytes(target, b"old")
    for delay in (0.3, 0.9, 1.7):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(big), target], env=run_env())
        time.sleep(delay)  # the kill lands this far into the put (the delays sweep it: before, during, after)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        data = storage.read_bytes(target)
        assert data == b"old" or data == big.read_bytes(), len(data)
    # Only the finished name is ever listed as a file a reader would take; leftovers are .tmp-*.
    names = [n for n in storage.listdir(s3_bucket + "/ckpt") if not n.startswith(storage.TMP_PREFIX)]
    assert names == ["latest.bin"]
