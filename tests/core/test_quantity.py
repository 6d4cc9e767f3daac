"""One size, one meaning: core.quantity's Kubernetes semantics, the same through the CLI,
job specs, rendered manifests and the webhook's `gpupool.io/gpu-memory`."""

from __future__ import annotations

import pytest

from gpupool.core.errors import InvalidInput
from gpupool.core.quantity import BYTE, MIB, parse_memory_mib


@pytest.mark.parametrize(
    "text, mib",
    [
        ("8Gi", 8192),
        ("8G", 7629),  # 8e9 bytes = 7629.39 MiB, rounded down
        ("8GB", 7629),
        ("16GiB", 16384),
        ("16gib", 16384),
        ("8192Mi", 8192),
        ("1.5Gi", 1536),
        (".5Gi", 512),
        ("1Ti", 1024 * 1024),
        ("8e9", 8_000_000_000),  # no unit: MiB on the command line, whatever the exponent
        ("8192", 8192),
        ("+4096Mi", 4096),
        ("1024Ki", 1),
        ("1500k", 1),
    ],
)
def test_command_line_sizes(text, mib):
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize("text, mib", [("8G", 7629), ("8Gi", 8192), ("8e9", 7629), ("8589934592", 8192), ("8M", 7)])
def test_kubernetes_sizes_bare_is_bytes(text, mib):
    assert parse_memory_mib(text, bare=BYTE) == mib


@pytest.mark.parametrize("bare", [MIB, BYTE])
@pytest.mark.parametrize(
    "text, words",
    [
        ("8000m", ["m", "10^-3", "8 bytes", "8000Mi"]),
        ("5u", ["10^-6", "5Mi"]),
        ("8g", ["ambiguous", "8Gi", "8G"]),
        ("8gb", ["ambiguous"]),
        ("8K", ["ambiguous"]),
        ("0", ["greater than zero"]),
        ("-1Gi", ["greater than zero"]),
        ("512Ki", ["less than 1 MiB"]),
        ("lots", ["not a size", "8Gi"]),
        ("8 Gi Gi", ["not a size"]),
    ],
)
def test_refused_with_the_fix(bare, text, words):
    with pytest.raises(InvalidInput) as err:
        parse_memory_mib(text, "-m", bare=bare)
    assert "-m" in err.value.message and repr(text) in err.value.message
    for word in words:
        assert word in err.value.message


def test_bare_number_names_its_unit():
    with pytest.raises(InvalidInput, match="bare number is bytes"):
        parse_memory_mib("8192", bare=BYTE)


def test_same_mib_everywhere():
    """`gpupool.io/gpu-memory: 8G`, `gpupool run -m 8G` and job-spec `memory: 8G` are one size,
    and a job's rendered limit reads back as that size in the webhook."""
    from gpupool.jobs.manifests import render_indexed
    from gpupool.jobs.spec import parse_spec
    from gpupool.kube.resources import read_ask

    pod_ask, errors = read_ask({"name": "t", "resources": {"limits": {"gpupool.io/gpu-memory": "8G"}}})
    assert not errors and pod_ask is not None
    spec = parse_spec(
        {
            "name": "size",
            "framework": "none",
            "image": "python:3.11-slim",
            "roles": {"worker": {"command": ["true"], "gpu": {"count": 1, "memory": "8G"}}},
        }
    )
    request = spec.roles[0].gpu
    assert request is not None
    cli = parse_memory_mib("8G", "-m")
    assert pod_ask.memory_mib == request.memory_mib == cli == 7629
    jobs = [o for o in render_indexed(spec) if o["kind"] == "Job"]
    container = jobs[0]["spec"]["template"]["spec"]["containers"][0]
    rendered, errors = read_ask(container)
    assert not errors and rendered is not None and rendered.memory_mib == 7629


def test_webhook_refuses_milli_memory():
    from gpupool.kube.resources import read_ask

    ask, errors = read_ask({"name": "t", "resources": {"limits": {"gpupool.io/gpu-memory": "8000m"}}})
    assert ask is None and any("8000Mi" in e and "gpu-memory" in e for e in errors)


def test_gpupool_run_m_8G_grants_the_same_mib(tmp_path):
    """`gpupool run -m 8G` end to end: the child's grant is 7629 MiB, as the webhook and specs read 8G."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, GPUPOOL_STATE=str(tmp_path), GPUPOOL_DEVICES="emulated:1x16GiB", HOME=str(tmp_path))
    env.pop("GPUPOOL_SERVER", None)
    child = "import os; print(os.environ['GPUPOOL_MEMORY_LIMIT_MIB'])"
    done = subprocess.run(
        [sys.executable, "-m", "gpupool", "run", "-q", "-n", "1", "-m", "8G", "--", sys.executable, "-c", child],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "7629"
    refused = subprocess.run(
        [sys.executable, "-m", "gpupool", "run", "-n", "1", "-m", "8000m", "--", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "8000Mi" in refused.stderr
