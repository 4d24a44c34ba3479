"""Regenerate the committed protobuf modules of this package from apache/rocketmq-apis.

Run from the repository root with grpcio-tools installed (a development tool, never a runtime
dependency):

    python -m common.grpc.v2.generate /path/to/rocketmq-apis

It compiles `apache/rocketmq/v2/definition.proto` and `service.proto` with grpcio-tools' bundled
protoc (Python messages and `.pyi` stubs), then rewrites protoc's absolute imports
(`from apache.rocketmq.v2 import ...`) to this package. The descriptors keep their proto file
names (`apache/rocketmq/v2/*.proto`), so what goes over the wire is byte-for-byte what every
RocketMQ 5 client expects.

The protoc that grpcio-tools bundles decides the oldest protobuf runtime the modules load with
(`ValidateProtobufRuntimeVersion` in their header); pyproject's `protobuf` lower bound must stay
at or below it. The committed modules were made by grpcio-tools 1.74 (protoc 6.31.1).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tempfile

PROTOS = ("apache/rocketmq/v2/definition.proto", "apache/rocketmq/v2/service.proto")
HERE = pathlib.Path(__file__).resolve().parent
PACKAGE = "common.grpc.v2"


def _rewrite_imports(text: str) -> str:
    return re.sub(
        r"^from apache\.rocketmq\.v2 import ", f"from {PACKAGE} import ", text, flags=re.M
    )


def generate(apis_root: pathlib.Path) -> None:
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{apis_root}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                *PROTOS,
            ],
            check=True,
        )
        for proto in PROTOS:
            stem = pathlib.Path(proto).stem
            for suffix in ("_pb2.py", "_pb2.pyi"):
                src = pathlib.Path(out) / pathlib.Path(proto).parent / f"{stem}{suffix}"
                (HERE / src.name).write_text(_rewrite_imports(src.read_text()))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m common.grpc.v2.generate <rocketmq-apis checkout>")
    generate(pathlib.Path(sys.argv[1]))
