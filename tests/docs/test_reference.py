"""The generated reference pages (tools/docs/reference.py) cover what they are generated from, and
the docs name only environment variables that the code has."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gpupool.cli.main import COMMANDS  # noqa: E402
from gpupool.core import errors  # noqa: E402
from tools.docs import reference  # noqa: E402


def test_the_cli_page_has_every_command_and_subcommand() -> None:
    page = reference.cli_page()
    for name in COMMANDS:
        assert f"\n## gpupool {name}\n" in page
    for sub in ("### gpupool queue set", "### gpupool token create", "### gpupool kube agent"):
        assert f"\n{sub}\n" in page
    assert "usage: gpupool run [-h]" in page


def test_the_exit_codes_page_has_every_error() -> None:
    page = reference.exit_codes_page()
    for cls in (errors.Unavailable, errors.LeaseLost, errors.Preempted, errors.StateUnusable):
        assert f"| `{cls.code}` | {cls.http_status} | {cls.exit_code} | `{cls.__name__}` |" in page
        assert f"\n| {cls.exit_code} | " in page


def test_the_metrics_page_has_the_families_of_both_registries() -> None:
    page = reference.metrics_page()
    for name in ("gpupool_claims_total", "gpupool_claim_latency_seconds", "gpupool_device_memory_total_bytes"):
        assert f"| `{name}` |" in page
    assert "| `gpupool_webhook_requests_total` | counter | `route`, `result` |" in page


def test_the_api_page_has_every_operation_of_the_openapi_document() -> None:
    doc = reference.openapi_document()
    page = reference.api_page()
    for path, operations in doc["paths"].items():
        for method in operations:
            assert f"\n### {method.upper()} {path} " in page
    assert "### Claim" in page or "Claim" in page


def test_the_job_spec_page_has_every_field() -> None:
    schema = reference.job_spec_schema()
    page = reference.job_spec_page()
    for field in schema["properties"]:
        assert f"| `{field}` |" in page
    assert "| `replicas` |" in page and "| `fraction` |" in page


def test_the_docs_name_only_variables_the_code_has() -> None:
    known = set(reference.environment_variables()) | set(reference.TEST_ENV_NOTES)
    texts = [p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))] + [(ROOT / "README.md").read_text()]
    named = {name for text in texts for name in re.findall(r"\bGPUPOOL_[A-Z0-9_]*[A-Z0-9]\b", text)}
    assert sorted(named - known) == []


def test_every_variable_is_described() -> None:
    page = reference.environment_page()
    for name in reference.environment_variables():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
        assert not row.endswith("|  |"), row


def test_the_test_suite_still_reads_its_variables() -> None:
    sources = "".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    assert [name for name in reference.TEST_ENV_NOTES if f'"{name}"' not in sources] == []
