"""Issue 23 item 8: client text never forges a line of a gpupool log (gpupool.logs.escaping_formatter)."""

from __future__ import annotations

import logging
import subprocess
import sys

import httpx

from gpupool.logs import (
    CONTINUATION,
    MAX_LOG_MESSAGE_CHARS,
    MAX_LOGGED_CHARS,
    clip,
    escape_controls,
    escaping_formatter,
)
from tests.envs import clean_env
from tests.waiting import wait_for_match

FORGED = "a\nFAKE LINE 2026-11-25 00:00:00,000 gpupool.serving.server WARNING admin token leaked\r\x1b[2Jb\u2028c"


def test_escape_controls_writes_every_control_character_as_an_escape():
    assert escape_controls("gpu-node-1 ünïcode") == "gpu-node-1 ünïcode"
    escaped = escape_controls(FORGED)
    assert escaped.isprintable() and "\\n" in escaped and "\\r" in escaped and "\\x1b" in escaped
    assert "\\u2028" in escaped and "\\x85" in escape_controls("\x85") and "\\x7f" in escape_controls("\x7f")


def test_a_record_is_one_line_and_its_traceback_cannot_start_one():
    formatter = escaping_formatter("%(levelname)s %(message)s")
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "host %s", (FORGED,), None)
    (line,) = formatter.format(record).splitlines()
    assert line.startswith("WARNING host a\\nFAKE LINE")
    try:
        raise ValueError(FORGED)
    except ValueError:
        record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    first, *rest = formatter.format(record).split("\n")
    assert first == "ERROR failed" and rest and all(line.startswith(CONTINUATION) for line in rest), rest
    assert f"{CONTINUATION}ValueError: a" in rest and any(line.startswith(f"{CONTINUATION}FAKE LINE") for line in rest)
    assert all(line.isprintable() for line in rest)  # the \r and the terminal escape too


def test_a_newline_in_a_holder_field_forges_no_line_of_a_real_servers_log(tmp_path):
    log = tmp_path / "server.log"
    env = clean_env(HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "gpupool", "-v", "server", "--listen", "127.0.0.1:0"]
    args += ["--state", str(tmp_path / "state"), "--devices", "emulated:2x16GiB"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = wait_for_match(log, r"listening on (\S+)", proc).group(1)
        holder = {"host": FORGED, "name": "x\nFAKE NAME", "label": "job\nFAKE LABEL", "pid": 1}
        body = {"claim": {"requests": [{"count": 1, "fraction": 0.5}]}, "holder": holder, "ttl_s": 60}
        r = httpx.post(url + "/v1/leases", json=body, timeout=30)
        assert r.status_code == 201, r.text
        assert r.json()["holder"]["host"] == FORGED  # the data is kept as sent: only the log escapes it
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "a\\nFAKE LINE" in text, text  # the claim was logged, escaped
    assert not [line for line in text.splitlines() if line.startswith("FAKE")], text
    assert "\x1b" not in text and "\u2028" not in text


def test_bidirectional_and_other_invisible_characters_are_escaped_too():
    # Issue 34 item 5: U+202E turns 'job\u202etxt.exe' into what reads as 'jobexe.txt'.
    for char in ("\u202e", "\u202a", "\u2066", "\u2069", "\u200e", "\u200b", "\u061c", "\ufeff", "\U000e0001"):
        escaped = escape_controls(f"job{char}txt")
        assert escaped.isprintable() and char not in escaped and repr(char)[1:-1] in escaped, repr(char)
    assert escape_controls("ünïcode 漢字 ✓") == "ünïcode 漢字 ✓"  # printable text is left alone


def test_a_long_client_string_is_logged_cut_short_with_a_marker():
    formatter = escaping_formatter("%(levelname)s %(message)s")
    label = "L" * 900_000
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "lease %s granted to %s", ("abc", label), None)
    line = formatter.format(record)
    assert line.startswith("INFO lease abc granted to LLL") and "more characters]" in line
    assert len(line) < MAX_LOGGED_CHARS + 100
    assert record.args == ("abc", label)  # the record itself is untouched (other handlers)
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "joined: " + "x" * 100_000, (), None)
    assert len(formatter.format(record)) < MAX_LOG_MESSAGE_CHARS + 100  # an f-string or a str() too
    assert clip("short") == "short" and clip("ab" * 10, 4) == "abab...[16 more characters]"
