"""gpupool.codecache: dataclasses built from the table behave exactly as compiled ones, a changed
class or a foreign table only costs the compile, and the workload side finds its table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict

from gpupool import codecache

SRC = Path(__file__).resolve().parents[2] / "src"

SAMPLE = '''
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Dict, Optional, Tuple


@dataclass(frozen=True)
class Point:
    """A frozen one, hashed."""

    x: int
    y: int = 0
    tags: Tuple[str, ...] = field(default_factory=tuple)
    LIMIT: ClassVar[int] = 3


@dataclass(order=True)
class Job:
    """A mutable, ordered one."""

    priority: int
    name: str = field(default="", compare=False)
    extra: Optional[Dict[str, int]] = None
'''

# Describes what the sample's classes do, with every generated method used once.
PROBE = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from gpupool import codecache
import dataclasses
calls = {"exec": 0}
if sys.argv[3] != "-":
    table = codecache.read(sys.argv[3])
    assert codecache.install(table)
    real = dataclasses.exec
    def counting(source, globals=None, locals=None):
        calls["exec"] += 1
        calls["hit"] = calls.get("hit", 0) + (source in table)
        real(source, globals, locals)
    dataclasses.exec = counting
import sample
p, q = sample.Point(1, tags=("a",)), sample.Point(1, tags=("a",))
try:
    p.x = 2
    frozen = "assigned"
except dataclasses.FrozenInstanceError as err:
    frozen = type(err).__name__
a, b = sample.Job(1, "a"), sample.Job(2, "b")
b.name = "c"
print(json.dumps({
    "repr": [repr(p), repr(a), repr(b)],
    "eq": [p == q, p == sample.Point(2), a == sample.Job(1, "z")],
    "hash": hash(p) == hash(q),
    "order": [a < b, b <= a],
    "frozen": frozen,
    "annotations": [str(sample.Point.__init__.__annotations__), str(sample.Job.__init__.__annotations__)],
    "qualnames": [sample.Point.__init__.__qualname__, sample.Job.__lt__.__qualname__],
    "defaults": [sample.Point.__init__.__defaults__ is None, repr(sample.Job.__init__.__defaults__)],
    "fields": [f.name for f in dataclasses.fields(sample.Job)],
    "calls": calls,
}))
"""


def probe(tmp_path: Path, table: str) -> Dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path), str(SRC), table],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def write_table(tmp_path: Path, modules: str = "sample") -> Path:
    table = tmp_path / "table.bin"
    script = f"import sys; sys.path[:0] = [{str(tmp_path)!r}, {str(SRC)!r}]; from gpupool import codecache; "
    script += f"print(codecache.write({str(table)!r}, {modules.split(',')!r}))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0
    return table


def test_classes_from_the_table_are_those_compiled_at_import(tmp_path):
    (tmp_path / "sample.py").write_text(SAMPLE)
    table = write_table(tmp_path)
    compiled, cached = probe(tmp_path, "-"), probe(tmp_path, str(table))
    calls = cached.pop("calls")
    compiled.pop("calls")
    assert cached == compiled
    assert calls["exec"] > 0 and calls["hit"] == calls["exec"]  # every method came from the table


def test_a_class_changed_since_is_compiled_as_before(tmp_path):
    (tmp_path / "sample.py").write_text(SAMPLE)
    table = write_table(tmp_path)
    (tmp_path / "sample.py").write_text(SAMPLE.replace("y: int = 0", "y: int = 5\n    z: int = 7"))
    cached, compiled = probe(tmp_path, str(table)), probe(tmp_path, "-")
    calls = cached.pop("calls")
    compiled.pop("calls")
    assert cached == compiled and "z=7" in cached["repr"][0]
    assert 0 < calls["hit"] < calls["exec"]  # Job still from the table, Point's new methods compiled


def test_a_table_of_another_interpreter_or_damaged_is_none(tmp_path):
    table = tmp_path / "table.bin"
    table.write_bytes(b"\x00\x01\r\n" + b"anything")
    assert codecache.read(str(table)) == {}
    table.write_bytes(codecache._magic_number() + b"\xff not marshal")
    assert codecache.read(str(table)) == {}
    assert codecache.read(str(tmp_path / "missing.bin")) == {}
    assert codecache.install({}) is False


def test_the_workload_side_is_covered(tmp_path):
    # Every dataclass that `gpupool run` defines on the embedded pool is in a table written as
    # `make install` writes it.
    table = tmp_path / "table.bin"
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(SRC)!r})
        from gpupool import codecache
        here = os.path.dirname(codecache.__file__)
        print(codecache.write({str(table)!r}, codecache.workload_modules(here)))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    entries = codecache.read(str(table))
    assert len(entries) == int(done.stdout) > 100
    names = set(codecache.workload_modules(str(SRC / "gpupool")))
    assert {"gpupool.core.model", "gpupool.pool.service", "gpupool.runner.session", "gpupool.cli.run"} <= names
