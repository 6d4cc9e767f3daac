"""Regenerate the *_pb2.py / *_pb2_grpc.py stubs from the upstream .proto files (needs grpcio-tools, a dev extra).

The generated stubs are committed, so the agent needs only grpcio and protobuf at runtime.
"""

from __future__ import annotations

import pathlib
import re
import sys

PROTOS = ("pluginregistration", "dra")


def main() -> int:
    from grpc_tools import protoc

    here = pathlib.Path(__file__).resolve().parent
    for name in PROTOS:
        rc: int = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{here}",
                f"--python_out={here}",
                f"--grpc_python_out={here}",
                str(here / f"{name}.proto"),
            ]
        )
        if rc != 0:
            return rc
        # protoc writes `import NAME_pb2`, which only works with the folder on sys.path.
        stub = here / f"{name}_pb2_grpc.py"
        stub.write_text(re.sub(rf"^import {name}_pb2 as", f"from . import {name}_pb2 as", stub.read_text(), flags=re.M))
    return 0


if __name__ == "__main__":
    sys.exit(main())
