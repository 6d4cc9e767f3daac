"""train/storage.py on az:// URLs against Azurite, the Azure Storage emulator (npm `azurite`),
started on loopback; skipped, saying why, where `azurite-blob` is not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from envs import free_port
from waiting import wait_until

from gpupool.train import storage
from gpupool.train.storage import StorageError

from .conftest import REPO

# Azurite's documented development account (a public, well-known key, not a secret).
_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _azurite() -> str:
    found = shutil.which("azurite-blob") or str(REPO / ".ci" / "node" / "node_modules" / ".bin" / "azurite-blob")
    if not os.path.exists(found):
        pytest.skip("azurite-blob not installed (npm install azurite; .ci/run installs it where npm works)")
    pytest.importorskip("adlfs")
    return found


@pytest.fixture
def azure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A blob endpoint on loopback; this process reaches it through AZURE_STORAGE_CONNECTION_STRING."""
    port = free_port()
    proc = subprocess.Popen(
        [_azurite(), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(tmp_path), "--silent"]
        + ["--skipApiVersionCheck"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}/devstoreaccount1"

    def up() -> bool:
        assert proc.poll() is None, f"azurite exited ({proc.returncode})"
        try:
            urllib.request.urlopen(endpoint + "?comp=list", timeout=1)
        except urllib.error.HTTPError:  # it answers (403 without a signature): it is up
            pass
        except OSError:
            return False
        return True

    wait_until(up, 60, "azurite to answer", interval=0.2)
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={_KEY};BlobEndpoint={endpoint};",
    )
    try:
        fs, _ = storage.filesystem("az://runs/x")
        fs.mkdir("runs")
        yield "az://runs"
    finally:
        proc.kill()
        proc.wait()


def test_azure_roundtrip_atomic_put_and_errors(azure: str, tmp_path: Path) -> None:
    storage.write_bytes(azure + "/r1/a.txt", b"1")
    local = tmp_path / "ckpt.pt"
    local.write_bytes(os.urandom(3000))
    storage.put_file(local, azure + "/r1/checkpoints/ckpt-000001-000000000.pt")
    assert storage.find(azure + "/r1") == ["a.txt", "checkpoints/ckpt-000001-000000000.pt"]
    assert storage.read_bytes(azure + "/r1/checkpoints/ckpt-000001-000000000.pt") == local.read_bytes()
    storage.rename(azure + "/r1/a.txt", azure + "/r1/b.txt")
    assert storage.listdir(azure + "/r1") == ["b.txt", "checkpoints"]
    with pytest.raises(StorageError, match=r"^az://nothere/x.txt: the bucket does not exist; create it"):
        storage.read_bytes("az://nothere/x.txt")
    with pytest.raises(StorageError, match=r"^az://runs/r1/missing.txt does not exist; check the URL$"):
        storage.read_bytes(azure + "/r1/missing.txt")
