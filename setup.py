"""Build hooks: compile the Fluss wire protocol, the native row codec, the native KV loops, the native
Lookup wire codec and strom's RocksDB binding.

The protobuf module is generated from ``strom/rpc/proto/fluss_api.proto`` on every build (including
editable installs), so the ``.proto`` stays the single source of truth.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

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


def rocksdb_prefix() -> pathlib.Path | None:
    """Where RocksDB's static library and headers are: ``STROM_ROCKSDB_DIR``, else the build
    ``scripts/build-rocksdb.sh`` cached on this machine (``make install`` runs it first; a plain ``pip
    install`` only looks for it). None: strom is built without its binding and uses rocksdict."""
    if os.environ.get("STROM_ROCKSDB") == "off":
        return None
    configured = os.environ.get("STROM_ROCKSDB_DIR")
    if configured:
        return pathlib.Path(configured)
    script = ROOT / "scripts" / "build-rocksdb.sh"
    if not script.exists():  # an sdist without the script
        return None
    found = subprocess.run(["bash", str(script), "--cached-only"], capture_output=True, text=True, check=False)
    lines = found.stdout.split()
    return pathlib.Path(lines[-1]) if found.returncode == 0 and lines else None


def rocksdb_extension() -> list[Extension]:
    prefix = rocksdb_prefix()
    if prefix is None:
        return []
    return [
        Extension(
            "strom.kv._rocksdb",
            sources=["strom/kv/native/rocksdb_binding.c"],
            include_dirs=[str(prefix / "include")],
            extra_objects=[str(prefix / "lib" / "librocksdb.a")],
            libraries=["lz4", "snappy", "zstd", "z", "bz2", "stdc++", "pthread", "dl"],
            extra_compile_args=["-O2", "-std=c11"],
        )
    ]


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
        *rocksdb_extension(),
    ],
)
