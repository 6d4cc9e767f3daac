"""Build gpupool-run.pyz: the stdlib-only workload side (run, status, list-gpus, release) as one zipapp.

Usage: python tools/build_pyz.py [--no-compile] dist/gpupool-run.pyz

The Kubernetes webhook injects this file into pods; any Python >= 3.9
runs it: `python3 gpupool-run.pyz run -n 1 -p 0.5 -- python train.py`.

Beside each module's source the archive holds its bytecode for the Python that
builds it (`name.pyc`, the place zipimport looks first; unchecked-hash pycs, so
no timestamps are involved): that Python skips compiling at every start, and
any other version finds a foreign magic number and falls back to the source.
Bytecode is stored uncompressed (inflating it cost every start more than the
rest of zipimport's work); the sources, read only by other versions, are deflated.
"""

from __future__ import annotations

import argparse
import os
import py_compile
import stat
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Iterator, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "gpupool"
# The workload side: its whole floors (folders, all standard library only) and its CLI modules.
PACKAGES = ("core", "pooling", "workload")
CLI_MODULES = ("main", "run", "status", "pool_options", "filters", "workload")

SHEBANG = b"#!/usr/bin/env python3\n"
# Top-level modules of the package that the workload side imports.
TOP_FILES = ("__init__.py", "logs.py")
# Only the stdlib verbs of the CLI.
CLI_FILES = ("__init__.py", *(f"{name}.py" for name in CLI_MODULES))
MAIN = """\
import sys

if sys.version_info < (3, 9):
    sys.exit("gpupool-run.pyz needs Python >= 3.9, this is " + sys.version.split()[0])

from gpupool.cli.workload import main

sys.exit(main())
"""
# Fixed timestamp: the same sources give the same bytes (reproducible builds).
EPOCH = (2024, 1, 1, 0, 0, 0)


def sources() -> Iterator[Tuple[str, Path]]:
    """(name in archive, file) for every file that goes into the zipapp."""
    for name in TOP_FILES:
        yield f"gpupool/{name}", SRC / name
    for name in CLI_FILES:
        yield f"gpupool/cli/{name}", SRC / "cli" / name
    for package in PACKAGES:
        base = SRC / package
        for path in sorted(base.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
                yield f"gpupool/{path.relative_to(SRC).as_posix()}", path


def bytecode(source: Path, name: str, scratch: Path) -> Optional[bytes]:
    """The .pyc bytes of `source` for this Python (None where it cannot be compiled here).

    Unchecked hash: zipimport then neither compares timestamps nor reads the source again.
    `name` (the path in the archive) is what tracebacks show.
    """
    out = scratch / "module.pyc"
    try:
        py_compile.compile(
            str(source),
            cfile=str(out),
            dfile=name,
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
    except (py_compile.PyCompileError, OSError) as err:
        print(f"build_pyz: {name} not compiled ({err}); it runs from source", file=sys.stderr)
        return None
    return out.read_bytes()


def build(target: Path, compile_bytecode: bool = True) -> Path:
    """Write the zipapp to `target` (atomically) and make it executable."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as handle, tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        main = scratch / "__main__.py"
        main.write_text(MAIN)
        handle.write(SHEBANG)
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, path in [("__main__.py", main), *sources()]:
                info = zipfile.ZipInfo(name, EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, path.read_bytes())
                code = bytecode(path, name, scratch) if compile_bytecode and name.endswith(".py") else None
                if code is not None:
                    compiled = zipfile.ZipInfo(name + "c", EPOCH)
                    compiled.compress_type = zipfile.ZIP_STORED  # what runs: read without inflating
                    compiled.external_attr = 0o644 << 16
                    archive.writestr(compiled, code)
    mode = os.stat(partial).st_mode
    os.chmod(partial, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(partial, target)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default="dist/gpupool-run.pyz", help="where to write the zipapp")
    parser.add_argument(
        "--no-compile", action="store_true", help="sources only (no bytecode for the Python that builds it)"
    )
    args = parser.parse_args(argv)
    target = build(Path(args.target), compile_bytecode=not args.no_compile)
    print(f"wrote {target} ({target.stat().st_size // 1024} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
