"""Bytecode for the methods `@dataclass` writes, compiled once at install instead of at every start.

`dataclasses` writes each class's `__init__`, `__repr__`, `__eq__` ... as source text and
compiles it (`exec(text, globals, namespace)`) whenever the class is defined, that is at every
import: the compiling is four fifths of a dataclass's cost, and `gpupool run` defines some 35
of them. `install()` gives the `dataclasses` module an `exec` of its own (a module global
shadows the builtin) that takes the code object compiled from the same text out of a table
written ahead (`make install` and `tools/build_pyz.py` run `python -m gpupool.codecache`), and
compiles as before on a miss. Nothing else changes: the whole text is the key, so a class edited
since is a miss, never stale code; the code is compiled as `exec` compiles a string inside
`dataclasses` (no `__future__` flag inherited); the table is per interpreter (its cache tag in
the file name, its bytecode magic number inside), and a missing, foreign or unreadable one is no
table. It lies in the package's `__pycache__` (inside the zipapp too), beside the modules' own
bytecode.

Standard library only: the workload side and gpupool-run.pyz use it.
"""

from __future__ import annotations

import marshal
import os
import sys
from types import CodeType

from . import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, Dict, List, Mapping, Optional, Union

    # exec()'s namespaces, as dataclasses passes them
    Namespace = Optional[Dict[str, Any]]
    Locals = Optional[Mapping[str, object]]

NAME = "dataclass-code"
# The table covers the workload side (`gpupool run`, `status`, `release`, the zipapp): every
# module of these packages, and these CLI modules, are imported when it is written (and
# tools/build_pyz.py puts the same in the zipapp).
PACKAGES = ("core", "client", "runner", "isolation", "pool", "store", "devices")
CLI_MODULES = ("main", "parser", "run", "status", "pool_options", "workload")


def table_path(package_dir: str) -> Optional[str]:
    """Where this interpreter's table lies for the gpupool package at `package_dir` (None: an
    interpreter without bytecode caching)."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    return os.path.join(package_dir, "__pycache__", f"{NAME}.{tag}.bin")


def _magic_number() -> bytes:
    # importlib's frozen half is loaded in every process; importlib.util only where it is not.
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None)
    if isinstance(magic, bytes):
        return magic
    import importlib.util

    return importlib.util.MAGIC_NUMBER


def _compile(text: str) -> CodeType:
    """What `exec(text, ...)` in dataclasses compiles: a string, with no caller's future flags."""
    return compile(text, "<string>", "exec", dont_inherit=True)


def read(path: Optional[str] = None) -> Dict[str, CodeType]:
    """The table at `path` (default: this interpreter's for this package), {} when there is none
    that fits."""
    path = path or table_path(os.path.dirname(__file__))
    if path is None:
        return {}
    try:
        # Through the module's loader: in the zipapp, zipimport reads the file inside the archive.
        data = __spec__.loader.get_data(path)  # type: ignore[union-attr]
    except (OSError, AttributeError, NameError):
        return {}
    magic = _magic_number()
    if not data.startswith(magic):
        return {}
    try:
        table = marshal.loads(memoryview(data)[len(magic) :])  # no copy of the file's bytes
    except (ValueError, EOFError, TypeError):
        return {}
    return table if isinstance(table, dict) else {}


def install(table: Optional[Dict[str, CodeType]] = None) -> bool:
    """Let `dataclasses` take its generated methods' code from `table` (default: `read()`). Call
    it before the modules whose classes it should cover are imported; False when there is no
    table (or an `exec` is in `dataclasses` already)."""
    table = read() if table is None else table
    if not table:
        return False
    import dataclasses

    if "exec" in vars(dataclasses):
        return False

    def cached_exec(source: Union[str, CodeType], globals: Namespace = None, locals: Locals = None) -> None:
        if isinstance(source, str):
            code = table.get(source)
            source = code if code is not None else _compile(source)
        exec(source, globals, locals)

    dataclasses.exec = cached_exec  # type: ignore[attr-defined]
    return True


def write(path: str, modules: List[str]) -> int:
    """Import `modules`, recording every text `dataclasses` compiles meanwhile, and write them
    as the table at `path` (atomically); returns the number of entries. Meant for a fresh
    interpreter: a class defined before the call is not seen."""
    import dataclasses
    import importlib

    table: Dict[str, CodeType] = {}

    def recording_exec(source: Union[str, CodeType], globals: Namespace = None, locals: Locals = None) -> None:
        if isinstance(source, str):
            code = table.get(source)
            if code is None:
                code = table[source] = _compile(source)
            source = code
        exec(source, globals, locals)

    dataclasses.exec = recording_exec  # type: ignore[attr-defined]
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError as err:  # an optional library's module: its classes compile at run time
                print(f"codecache: {name} not covered ({err})", file=sys.stderr)
    finally:
        del dataclasses.exec  # type: ignore[attr-defined]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "wb") as handle:
        handle.write(_magic_number() + marshal.dumps(table))
    os.replace(partial, path)
    return len(table)


def workload_modules(package_dir: str) -> List[str]:
    """Every module of the workload side in the gpupool package at `package_dir`, by name."""
    names = [f"gpupool.cli.{m}" for m in CLI_MODULES]
    for package in PACKAGES:
        for folder, dirs, files in os.walk(os.path.join(package_dir, package)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            dotted = "gpupool." + os.path.relpath(folder, package_dir).replace(os.sep, ".")
            for file in sorted(f for f in files if f.endswith(".py")):
                names.append(dotted if file == "__init__.py" else f"{dotted}.{file[:-3]}")
    return names


def main(argv: List[str]) -> int:
    """`python -m gpupool.codecache [PATH]`: write the table of the gpupool package it runs from
    (default: into that package's __pycache__)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = argv[0] if argv else table_path(here)
    if path is None:
        print("codecache: this interpreter caches no bytecode; no table written", file=sys.stderr)
        return 0
    count = write(path, workload_modules(here))
    print(f"codecache: {count} dataclass methods compiled into {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
