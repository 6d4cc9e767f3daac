"""Every shell block of the guides, docs/index.md and README.md runs, on emulated GPUs, as written.

The convention for writers of those pages:

- A fenced block in `sh`, `bash` or `shell` is run as it stands; in `console`, its `$ ` lines
  are. Other languages (`text` for output, `yaml`, `python` ...) are not run.
- The blocks of one page run in order in one bash session (`set -e`: a failing command fails
  the page), so a later block sees what an earlier one exported, wrote or started with `&`
  (stop a server at the end with `kill $SERVER`; whatever is left is killed anyway).
- The session starts in a scratch folder whose entries are links to the repository's top-level
  files and folders (not the hidden ones) (so `examples/...` and `deploy/...` resolve, and new files land in the
  scratch folder), with HOME, GPUPOOL_STATE and the XDG folders in a temporary dir (no
  client.yaml or pool of the machine leaks in), GPUPOOL_DEVICES=emulated:2x16GiB, and the
  virtual environment's bin/ first on PATH.
- A block that cannot run here (it needs a GPU, a cluster, the network, another machine, or
  minutes of CPU) has, on the line right before its fence, `<!-- no-test: the reason -->`: it
  is reported as skipped with that reason.
- A block whose last command is meant to fail has `<!-- exit-code: N -->` right before its fence:
  its commands run without `set -e`, and the last one must exit N. (`cmd || echo "exit $?"`
  inside an ordinary block does the same for one command.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PAGES = sorted((ROOT / "docs" / "guides").glob("*.md")) + [ROOT / "docs" / "index.md", ROOT / "README.md"]
SHELLS = ("sh", "bash", "shell", "console")
PAGE_TIMEOUT_S = 240.0
DEVICES = "emulated:2x16GiB"
# Variables of the machine that would point a block at another pool, token or config.
CLEARED = ("GPUPOOL_SERVER", "GPUPOOL_TOKEN", "GPUPOOL_CONFIG", "GPUPOOL_CA", "GPUPOOL_LEASE_ID", "KUBECONFIG")
# Set in every process a page starts: what finds the ones that left its process group (setsid).
MARK_ENV = "GPUPOOL_DOCS_TEST"

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_NO_TEST = re.compile(r"^\s*<!--\s*no-test:\s*(?P<reason>.+?)\s*-->\s*$")
_EXIT = re.compile(r"^\s*<!--\s*exit-code:\s*(?P<code>\d+)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    text: str
    skip: Optional[str] = None  # the reason of its no-test comment
    exit_code: int = 0

    @property
    def where(self) -> str:
        return f"{_shown(self.page)}:{self.line}"


def _shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else str(page)


def blocks(page: Path) -> Iterator[Block]:
    """The shell blocks of `page`, with the convention's comments read."""
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group("fence"), m.group("lang").lower(), i
        body: List[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(m.group("indent")) :] if lines[i].startswith(m.group("indent")) else lines[i])
            i += 1
        i += 1
        if lang not in SHELLS:
            continue
        if lang == "console":
            body = [line[2:] for line in body if line.startswith("$ ")]
        before = lines[start - 1] if start > 0 else ""
        no_test, exit_code = _NO_TEST.match(before), _EXIT.match(before)
        yield Block(
            page,
            start + 1,
            "\n".join(body),
            skip=no_test.group("reason") if no_test else None,
            exit_code=int(exit_code.group("code")) if exit_code else 0,
        )


def _all_blocks() -> List[Block]:
    return [b for page in PAGES if page.exists() for b in blocks(page)]


def session_script(page_blocks: List[Block], marks: Path) -> str:
    """One bash script for a page's blocks; before each block it writes the block's line to `marks`."""
    parts = ["set -e\n"]
    for block in page_blocks:
        parts.append(f"\n# --- {block.where}\necho {block.line} > {marks}\n")
        if block.exit_code:
            parts.append(
                f"set +e\n{block.text}\n__rc=$?\nset -e\n"
                f'if [ "$__rc" != {block.exit_code} ]; then '
                f'echo "{block.where}: exited $__rc, the page says {block.exit_code}" >&2; exit 97; fi\n'
            )
        else:
            parts.append(f"{block.text}\n")
    parts.append(f"\necho done > {marks}\n")
    return "".join(parts)


def _workdir(tmp: Path) -> Path:
    """A scratch folder that sees the repository's files through links: writes stay in tmp."""
    work = tmp / "work"
    work.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name != "site":  # not .git, .venv (PATH has its bin/)
            (work / entry.name).symlink_to(entry)
    return work


def _env(tmp: Path, mark: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED and not k.startswith("XDG_")}
    home = tmp / "home"
    home.mkdir()
    env.update(
        HOME=str(home),
        GPUPOOL_STATE=str(tmp / "state"),
        GPUPOOL_DEVICES=DEVICES,
        XDG_STATE_HOME=str(home / ".local" / "state"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_CACHE_HOME=str(home / ".cache"),
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        VIRTUAL_ENV=str(BIN.parent),
        PYTHONUNBUFFERED="1",
        **{MARK_ENV: mark},
    )
    return env


def _marked_pids(mark: str) -> List[int]:
    """Processes whose environment carries this session's mark (also those that left its group)."""
    needle = f"{MARK_ENV}={mark}".encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # gone, or not ours to read
                pass
    return pids


def _stop_everything(proc: subprocess.Popen, mark: str) -> None:
    """End the session's process group and every process it started elsewhere; wait until all are gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for pid in _marked_pids(mark):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            wait_until(lambda: not _marked_pids(mark), timeout=5.0, what="the page's processes to end")
            break
        except AssertionError:
            if sig == signal.SIGKILL:
                raise
    if proc.poll() is None:
        proc.wait(timeout=10)


def run_page(page_blocks: List[Block], tmp: Path, timeout: float = PAGE_TIMEOUT_S) -> None:
    """Run a page's blocks in one bash session; fail naming the block that failed and its output."""
    work = _workdir(tmp)
    marks, log, script = tmp / "at-line", tmp / "session.log", tmp / "session.sh"
    script.write_text(session_script(page_blocks, marks))
    mark = tmp.name
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", str(script)],
            cwd=work,
            env=_env(tmp, mark),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, which _stop_everything ends
        )
        try:
            code: Optional[int] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _stop_everything(proc, mark)
    at = marks.read_text().strip() if marks.exists() else "?"
    if code == 0 and at == "done":
        return
    output = log.read_text(errors="replace")[-4000:]
    page = _shown(page_blocks[0].page)
    what = f"ran past {timeout:g} s" if code is None else f"exited {code}"
    pytest.fail(f"{page}: the block at line {at} {what}; the session's output ends with:\n{output}", pytrace=False)


ALL = _all_blocks()
RUNNABLE: Dict[Path, List[Block]] = {}
for _block in ALL:
    if _block.skip is None:
        RUNNABLE.setdefault(_block.page, []).append(_block)


@pytest.mark.slow
@pytest.mark.timeout(PAGE_TIMEOUT_S + 60)
@pytest.mark.parametrize("page", sorted(RUNNABLE), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_blocks_of_a_page_run(page: Path) -> None:
    if MARK_ENV in os.environ:  # a page's `make test` block runs this suite: it must not run the pages again
        pytest.skip(f"inside the session of a page ({MARK_ENV} is set)")
    with tempfile.TemporaryDirectory(prefix="gpupool-docs-") as tmp:
        run_page(RUNNABLE[page], Path(tmp))


@pytest.mark.parametrize("block", [b for b in ALL if b.skip], ids=lambda b: b.where)
def test_blocks_that_cannot_run_here_say_why(block: Block) -> None:
    assert block.skip.strip(), f"{block.where}: no-test needs a reason"
    pytest.skip(f"{block.where}: {block.skip}")


# -- the runner itself -------------------------------------------------------------------------


def _page(tmp_path: Path, text: str) -> List[Block]:
    page = tmp_path / "page.md"
    page.write_text(text)
    return list(blocks(page))


def test_the_convention_is_read(tmp_path: Path) -> None:
    found = _page(
        tmp_path,
        "# T\n\n```sh\necho one\n```\n\n<!-- no-test: needs a cluster -->\n```bash\nkubectl get pods\n```\n\n"
        "```text\nnot run\n```\n\n<!-- exit-code: 3 -->\n```sh\nexit_three\n```\n\n"
        "```console\n$ echo two\ntwo\n```\n",
    )
    assert [(b.line, b.text, b.skip, b.exit_code) for b in found] == [
        (3, "echo one", None, 0),
        (8, "kubectl get pods", "needs a cluster", 0),
        (17, "exit_three", None, 3),
        (21, "echo two", None, 0),
    ]


def test_a_failing_block_fails_its_page_and_is_named(tmp_path: Path) -> None:
    found = _page(tmp_path, "```sh\ntrue\n```\n\n```sh\necho before\nfalse\necho after\n```\n")
    (tmp_path / "s").mkdir()
    with pytest.raises(pytest.fail.Exception) as failed:
        run_page(found, tmp_path / "s")
    assert "block at line 5 exited 1" in str(failed.value) and "before" in str(failed.value)
    assert "after" not in str(failed.value)


def test_blocks_share_one_session_and_the_stated_exit_code_is_checked(tmp_path: Path) -> None:
    text = (
        "```sh\nexport X=1\ncd examples\n```\n\n<!-- exit-code: 3 -->\n```sh\n"
        'test "$X" = 1 && test -e digits-ddp.yaml && test ! -e ~/.gpupool && sh -c "exit 3"\n```\n'
    )
    (tmp_path / "s").mkdir()
    run_page(_page(tmp_path, text), tmp_path / "s")
    (tmp_path / "t").mkdir()
    with pytest.raises(pytest.fail.Exception, match="exited 0, the page says 4"):
        run_page(
            _page(tmp_path, text.replace("exit-code: 3", "exit-code: 4").replace("exit 3", "exit 0")), tmp_path / "t"
        )


def test_nothing_a_page_started_outlives_it(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    text = f"```sh\nsleep 300 &\necho $! >> {pids}\nsetsid sleep 300 &\necho $! >> {pids}\n```\n"
    (tmp_path / "s").mkdir()
    run_page(_page(tmp_path, text), tmp_path / "s")
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 2
    wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in started), timeout=10, what="no sleep left")
