"""A lease's command that tries to take more GPU memory than its share (standard library, CUDA driver API).

`python -m gpupool.bench.isolation.alloc --times 1.5 --out FILE`: reads its share in MiB from the
lease's contract (GPUPOOL_MEMORY_LIMIT_MIB), asks the driver for `times` that much with one
cuMemAlloc (ctypes: no framework, so no hook can hold it back; only the driver's MPS limit or the
watchdog can), and writes what happened to FILE: {"over": true} when the allocation past the share
succeeded. A command with no share in its env asks for `times` a GiB and says it had no share.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from ...pooling.isolation.env import MEMORY_LIMIT_ENV, MPS_MEMORY_LIMIT_ENV, MPS_PIPE_ENV

MIB = 1 << 20


def attempt(times: float, environ: Dict[str, str]) -> Dict[str, Any]:
    """Try to allocate `times` the share on the lease's first GPU; what the driver said."""
    share_text = environ.get(MEMORY_LIMIT_ENV, "").split(",")[0]
    share_mib = int(share_text) if share_text.isdigit() else 0
    ask_mib = int((share_mib or 1024) * times)
    out: Dict[str, Any] = {
        "share_mib": share_mib or None,
        "asked_mib": ask_mib,
        "mps": bool(environ.get(MPS_PIPE_ENV)) and bool(environ.get(MPS_MEMORY_LIMIT_ENV)),
    }
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for call, args in (
        ("cuInit", (0,)),
        ("cuDeviceGet", (ctypes.byref(dev), 0)),
        ("cuCtxCreate_v2", (ctypes.byref(ctx), 0, dev)),
    ):
        rc = getattr(cuda, call)(*args)
        if rc != 0:
            return dict(out, over=False, stage=call, cuda_error=rc)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0:
        # Recorded, not judged: on an H100 (driver 580) an MPS client with a pinned limit is still
        # told the whole device's total, so only the allocation shows whether the cap held.
        out["context_total_mib"] = total.value // MIB
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(ask_mib * MIB))
    # Past the share is over the cap only when there was a share to be past.
    return dict(out, over=rc == 0 and share_mib > 0, stage="cuMemAlloc", cuda_error=rc)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpupool.bench.isolation.alloc", description=__doc__)
    p.add_argument("--times", type=float, default=1.5, help="how many times the share to ask for (default 1.5)")
    p.add_argument("--out", required=True, type=Path, help="where to write what happened (JSON)")
    args = p.parse_args(argv)
    result = dict(attempt(args.times, dict(os.environ)), pid=os.getpid())
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
