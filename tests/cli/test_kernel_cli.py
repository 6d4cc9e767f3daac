"""`gpupool kernel install/list/remove`: the kernelspec written, and one-line errors (exit 2)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
from gpupool_cli import gpupool

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")


@pytest.fixture
def env(tmp_path: Path) -> Dict[str, str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "GPUPOOL_"))}
    return dict(base, JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_PATH=str(tmp_path / "data"))


def test_install_list_remove(env: Dict[str, str], tmp_path: Path) -> None:
    done = gpupool(
        "kernel", "install", "gpu-quarter", "--fraction", "0.25", "--queue", "team-a", "--idle-suspend", "5m", env=env
    )
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "data" / "kernels" / "gpu-quarter" / "kernel.json").read_text())
    assert spec["argv"][-1] == "{connection_file}" and spec["language"] == "python"
    assert "supported_encryption" not in spec["metadata"], "the proxy relays plain ZeroMQ"
    assert spec["metadata"]["kernel_provisioner"] == {
        "provisioner_name": "gpupool-provisioner",
        "config": {
            "kernel_name": "gpu-quarter",
            "fraction": 0.25,
            "memory_mib": None,
            "queue": "team-a",
            "idle_suspend_s": 300.0,
            "server": "",
        },
    }
    assert gpupool("kernel", "install", "big", "--memory", "8GiB", "--idle-suspend", "never", env=env).returncode == 0
    listed = gpupool("kernel", "list", env=env).stdout.splitlines()
    assert [line.split("\t")[0] for line in listed] == ["big", "gpu-quarter"]
    assert "8192 MiB GPU" in listed[0] and "idle suspend never" in listed[0]
    wraps_ours = gpupool("kernel", "install", "again", "--kernel", "gpu-quarter", env=env)
    assert wraps_ours.returncode == 2 and "a gpupool kernel already" in wraps_ours.stderr
    assert gpupool("kernel", "remove", "big", env=env).returncode == 0
    assert [line.split("\t")[0] for line in gpupool("kernel", "list", env=env).stdout.splitlines()] == ["gpu-quarter"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["install", "a/b", "-p", "0.5"], "kernel name"),
        (["install", "k", "-p", "1.5"], "--fraction"),
        (["install", "k", "-m", "lots"], "--memory"),
        (["install", "k", "--idle-suspend", "soon"], "--idle-suspend"),
        (["install", "k", "--queue", "Team A"], "queue name"),
        (["install", "k", "--server", "ftp://x"], "--server"),
        (["install", "k", "--kernel", "nope"], "no kernel 'nope'"),
        (["install", "python3"], "cannot wrap itself"),
        (["remove", "python3"], "no gpupool kernel"),
    ],
)
def test_hostile_input_gives_one_line(env: Dict[str, str], args: list, words: str) -> None:
    done = gpupool("kernel", *args, env=env)
    assert done.returncode in (2, 4), done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def kernelspecs(env: Dict[str, str]) -> Dict[str, str]:
    """Name -> display name as Jupyter's own client lists them (`jupyter kernelspec list --json`)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "jupyter"), "kernelspec", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return {name: k["spec"]["display_name"] for name, k in json.loads(done.stdout)["kernelspecs"].items()}


def test_kernels_that_differ_get_names_that_differ(env: Dict[str, str], tmp_path: Path) -> None:
    """No NAME: the folder and the display name come from the settings, so two shares or idle limits never collide."""
    for args in (["-p", "0.25"], ["-p", "0.25", "--idle-suspend", "3s"], ["-p", "0.5", "--queue", "team-a"]):
        done = gpupool("kernel", "install", *args, env=env)
        assert done.returncode == 0, done.stderr
    specs = kernelspecs(env)
    assert specs["gpu-0.25-idle-10m"] == "Python 3 (ipykernel) [gpupool 0.25 GPU, idle 10m]"
    assert specs["gpu-0.25-idle-3s"] == "Python 3 (ipykernel) [gpupool 0.25 GPU, idle 3s]"
    assert specs["gpu-0.5-idle-10m-team-a"] == "Python 3 (ipykernel) [gpupool 0.5 GPU, idle 10m, queue team-a]"
    assert sorted(p.name for p in (tmp_path / "data" / "kernels").iterdir()) == sorted(
        ["gpu-0.25-idle-10m", "gpu-0.25-idle-3s", "gpu-0.5-idle-10m-team-a"]
    )
    # The same settings again replace the kernel rather than add a second of the same display name.
    assert gpupool("kernel", "install", "-p", "0.25", env=env).returncode == 0
    assert sorted(kernelspecs(env).values()).count("Python 3 (ipykernel) [gpupool 0.25 GPU, idle 10m]") == 1


OTHER_UID = 60001
# Run as OTHER_UID in a mount namespace: the interpreter lives under /root (mode 0700), so the other
# user cannot exec it; a root child imports what it needs, drops to OTHER_UID, then runs Jupyter's
# KernelSpecManager (what `jupyter kernelspec list` and every frontend use) and gpupool's CLI.
AS_OTHER = """
import contextlib, io, json, os, sys
import jupyter_client.kernelspec, gpupool.cli.main, gpupool.cli.kernel, gpupool.serving.notebook.kernelspec
import argparse, dataclasses, shutil, tempfile, difflib, gettext, textwrap
os.setgroups([]); os.setgid({uid}); os.setuid({uid})
os.environ["HOME"] = sys.argv[1]
for k in [k for k in os.environ if k.startswith(("JUPYTER_", "XDG_"))]:
    del os.environ[k]
found = {{"list": jupyter_client.kernelspec.KernelSpecManager().get_all_specs()}}
for verb, argv in (("refused", ["install", "--system", "-p", "0.5"]), ("remove", ["remove", "gpu-0.25-idle-5m"])):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = gpupool.cli.main.main(["kernel", *argv])
        except SystemExit as e:
            rc = e.code
    found[verb] = [rc, err.getvalue()]
print(json.dumps(found))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_system_install_is_seen_by_every_user(env: Dict[str, str], tmp_path: Path) -> None:
    """`--system` as root writes Jupyter's system kernels folder, which another user's Jupyter lists;
    that user may not install or remove there (exit 2, one line naming the folder and the fix).

    In a mount namespace of its own with a tmpfs on /usr/local/share, so the machine's folder is untouched."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "as_other.py").write_text(AS_OTHER.format(uid=OTHER_UID))
    script = f"""
set -u
mount -t tmpfs -o mode=755 tmpfs /usr/local/share
other_home=$(mktemp -d) && chown {OTHER_UID}:{OTHER_UID} $other_home
{sys.executable} -m gpupool kernel install --system -p 0.25 --idle-suspend 5m > {out}/root.out 2> {out}/root.err
echo $? > {out}/root.rc
{sys.executable} {tmp_path}/as_other.py $other_home > {out}/other.json 2> {out}/other.err
ls /usr/local/share/jupyter/kernels > {out}/left
rm -rf $other_home
"""
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "root.rc").read_text().strip() == "0", (out / "root.err").read_text()
    assert "/usr/local/share/jupyter/kernels/gpu-0.25-idle-5m" in (out / "root.out").read_text()
    other = json.loads((out / "other.json").read_text() or "{}")
    assert other, (out / "other.err").read_text()
    spec = other["list"]["gpu-0.25-idle-5m"]
    assert spec["resource_dir"] == "/usr/local/share/jupyter/kernels/gpu-0.25-idle-5m"
    assert spec["spec"]["display_name"] == "Python 3 (ipykernel) [gpupool 0.25 GPU, idle 5m]"
    assert spec["spec"]["metadata"]["kernel_provisioner"]["provisioner_name"] == "gpupool-provisioner"
    for verb, words in (("refused", "needs root: run it with sudo"), ("remove", "remove it as root")):
        rc, err = other[verb]
        assert rc == 2, err
        assert words in err and "/usr/local/share/jupyter/kernels" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert (out / "left").read_text().split() == ["gpu-0.25-idle-5m"], "the refused user changed nothing"
