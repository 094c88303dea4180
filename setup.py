"""Build hooks: compile the Fluss wire protocol, the native row codec, the native KV loops and the native
Lookup wire codec.

The protobuf module is generated from ``strom/rpc/proto/fluss_api.proto`` on every build (including
editable installs), so the ``.proto`` stays the single source of truth.
"""

from __future__ import annotations

import pathlib

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).parent
PROTO_DIR = ROOT / "strom" / "rpc" / "proto"


def compile_protos() -> None:
    from grpc_tools import protoc  # build requirement, see pyproject.toml

    import grpc_tools

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        status = protoc.main(
            ["protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={PROTO_DIR}", str(proto)]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed on {proto.name} with status {status}")


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        compile_protos()
        super().run()


setup(
    cmdclass={"build_py": BuildPyWithProtos},
    ext_modules=[
        Extension(
            "strom.records._rowcodec",
            sources=["strom/records/native/rowcodec.c"],
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "strom.kv._kvloops",
            sources=["strom/kv/native/kvloops.c"],
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "strom.rpc._lookupwire",
            sources=["strom/rpc/native/lookupwire.c"],
            extra_compile_args=["-O2", "-std=c11"],
        ),
    ],
)
