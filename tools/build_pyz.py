"""Build gpupool-run.pyz: the stdlib-only workload side (run, status, list-gpus, release) as one zipapp.

Usage: python tools/build_pyz.py dist/gpupool-run.pyz

The Kubernetes webhook injects this file into pods; any Python >= 3.9
runs it: `python3 gpupool-run.pyz run -n 1 -p 0.5 -- python train.py`.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import zipfile
from pathlib import Path
from typing import Iterator, Tuple

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "gpupool"
SHEBANG = b"#!/usr/bin/env python3\n"
# Whole packages of the workload side (all standard library only).
PACKAGES = ("core", "client", "runner", "isolation", "pool", "store", "devices")
# Top-level modules of the package that the workload side imports.
TOP_FILES = ("__init__.py", "logs.py")
# Only the stdlib verbs of the CLI.
CLI_FILES = ("__init__.py", "main.py", "run.py", "status.py", "pool_options.py", "workload.py")
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


def build(target: Path) -> Path:
    """Write the zipapp to `target` (atomically) and make it executable."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as handle:
        handle.write(SHEBANG)
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(zipfile.ZipInfo("__main__.py", EPOCH), MAIN)
            for name, path in sources():
                info = zipfile.ZipInfo(name, EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, path.read_bytes())
    mode = os.stat(partial).st_mode
    os.chmod(partial, mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(partial, target)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", nargs="?", default="dist/gpupool-run.pyz", help="where to write the zipapp")
    args = parser.parse_args(argv)
    target = build(Path(args.target))
    print(f"wrote {target} ({target.stat().st_size // 1024} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
