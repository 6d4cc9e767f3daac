"""Issue 34 item 5, object storage: no password, signature or secret env value is echoed by a
message or printed by `gpupool submit --dry-run`, and a presigned URL is no `checkpoints:`."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from gpupool.train.storage import REDACTED

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzSECRET1",
    "HF_TOKEN": "hf_zzSECRET2",
    "DB_PASSWORD": "zzSECRET3",
    "AZURE_STORAGE_CONNECTION_STRING": "AccountName=a;AccountKey=zzSECRET4",
}


def _submit(tmp_path: Path, spec: dict, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return subprocess.run(
        [sys.executable, "-m", "gpupool", "submit", str(path), "--dry-run", "--state", str(tmp_path / "state"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _spec(**extra: object) -> dict:
    return {"name": "secrets", "roles": {"worker": {"replicas": 1, "command": ["python", "train.py"]}}, **extra}


@pytest.mark.parametrize("target", ["local", "kubernetes"])
def test_dry_run_prints_no_secret_of_the_specs_env(tmp_path, target):
    env = dict(SECRETS, DATABASE_URL="postgres://app:zzSECRET5@db:5432/app", PLAIN="shown-as-is")
    spec = _spec(env=env)
    spec["roles"]["worker"]["command"] = ["python", "train.py", "--hub-token", "$(HF_TOKEN)"]
    done = _submit(tmp_path, spec, "--target", target)
    assert done.returncode == 0, done.stderr
    assert "zzSECRET" not in done.stdout, done.stdout
    assert "shown-as-is" in done.stdout and "AWS_SECRET_ACCESS_KEY" in done.stdout
    assert REDACTED in done.stdout and f"postgres://{REDACTED}@db:5432/app" in done.stdout


@pytest.mark.parametrize(
    "url, says",
    [
        (
            "s3://bucket/jobs/x?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIAzzSECRET6&X-Amz-Signature=zzSECRET7",
            "signature",
        ),
        ("https://bucket.s3.amazonaws.com/jobs/x?sig=zzSECRET8&sv=2022", "signature"),
        ("s3://AKIAEXAMPLE:wJal/zzSECRET9@bucket/jobs/x", "credentials"),
        ("https://user:zzSECRET10@minio.example/jobs", "credentials"),
    ],
)
def test_checkpoints_with_credentials_or_a_signature_are_refused_without_echoing_them(tmp_path, url, says):
    done = _submit(tmp_path, _spec(checkpoints=url))
    assert done.returncode == 2, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert "checkpoints" in line and says in line and "zzSECRET" not in line, line
    assert "storageSecret" in line, line  # the fix


def test_storage_errors_never_show_a_urls_password(tmp_path, s3_bucket):
    # s3fs takes no key in the URL: whatever fails, the message hides what was written there.
    urls = (
        "https://user:zzSECRET11@example.invalid/digits",
        "s3://AKIA:wJal/zzSECRET12@no-such-bucket/digits",
        s3_bucket.replace("s3://", "s3://testing:zzSECRET13@") + "/digits",
    )
    for url in urls:
        done = subprocess.run(
            [sys.executable, "-m", "gpupool", "data", "digits", "--to", url, "--limit-per-class", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "zzSECRET" not in line and f"://{REDACTED}@" in line, line


@pytest.mark.skipif(os.geteuid() != 0, reason="reads as another local user: needs root")
def test_a_local_jobs_spec_and_logs_are_its_owners_only():
    shared = Path(tempfile.mkdtemp(prefix="gpupool-jobs-", dir="/tmp"))  # pytest's tmp_path is root's alone
    try:
        shared.chmod(0o755)
        spec = _spec(env=SECRETS)
        spec["roles"]["worker"]["command"] = ["true"]
        (shared / "job.yaml").write_text(yaml.safe_dump(spec))
        state = shared / "state"
        done = subprocess.run(
            [sys.executable, "-m", "gpupool", "submit", str(shared / "job.yaml"), "--state", str(state), "-f"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        spec_file = state / "jobs" / "secrets" / "spec.json"
        assert "zzSECRET" in spec_file.read_text()  # kept as written: the job needs it
        assert stat.S_IMODE((state / "jobs").stat().st_mode) == 0o700
        probe = subprocess.run(
            [sys.executable, "-c", f"import os; os.setgid(60003); os.setuid(60003); open({str(spec_file)!r}).read()"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)
