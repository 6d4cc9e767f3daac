"""Regenerate api_pb2.py / api_pb2_grpc.py from api.proto (needs grpcio-tools, a dev extra).

The generated stubs are committed, so the agent needs only grpcio and protobuf at runtime.
"""

from __future__ import annotations

import pathlib
import re
import sys


def main() -> int:
    from grpc_tools import protoc

    here = pathlib.Path(__file__).resolve().parent
    rc: int = protoc.main(
        ["grpc_tools.protoc", f"-I{here}", f"--python_out={here}", f"--grpc_python_out={here}", str(here / "api.proto")]
    )
    if rc != 0:
        return rc
    # protoc writes `import api_pb2`, which only works with the folder on sys.path.
    stub = here / "api_pb2_grpc.py"
    stub.write_text(re.sub(r"^import api_pb2 as", "from . import api_pb2 as", stub.read_text(), flags=re.M))
    return 0


if __name__ == "__main__":
    sys.exit(main())
