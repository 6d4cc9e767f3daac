"""deploy/monitoring's alert rules with the real promtool: they parse, and every alert has unit tests that fire it.

Needs Debian's `prometheus` package (promtool); skipped with the reason where it is missing.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest
import yaml

MONITORING = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool: apt-get install prometheus")


def promtool(*args: str) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60)


def alert_names() -> set:
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    return {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}


@needs_promtool
def test_promtool_check_rules():
    done = promtool("check", "rules", "alerts.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in done.stdout


@needs_promtool
def test_promtool_test_rules():
    done = promtool("test", "rules", "alerts_test.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_promtool_check_the_example_config():
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_quiet():
    tests = yaml.safe_load((MONITORING / "alerts_test.yaml").read_text())
    fired, quiet = set(), set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = alert_names()
    assert names == fired, f"alerts without a test that fires them: {sorted(names - fired)}"
    assert names == quiet, f"alerts without a test where they stay quiet: {sorted(names - quiet)}"


def test_every_alert_says_what_to_do():
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
            assert rule["annotations"]["summary"] and len(rule["annotations"]["description"]) > 60, rule["alert"]
