"""Body-compressed Arrow IPC RecordBatch messages: ZSTD compressed by strom rather than by pyarrow's writer.

An ARROW log batch's records are one Arrow IPC RecordBatch message whose body buffers are each compressed
with the table's codec (``table.log.arrow.compression.type``, ``...zstd.level``). pyarrow's compressing
writer sets up a new ZSTD context for every buffer it compresses, ~10 µs each here, and a changelog batch
has four or more buffers: on a primary-key table's write path that was the event loop's largest single
cost (docs/benchmarks.md). It also writes a whole stream, from which the message must be cut.

So for ZSTD, pyarrow serializes the batch uncompressed (it knows slicing, offsets and nested types), each
body buffer is compressed with a ZSTD compressor kept per thread, and the message's metadata is filled in
from a *template*: the metadata pyarrow's compressing writer made once for a batch of the same schema. The
layout of that flatbuffer depends only on the schema (each field node and buffer is a fixed-size struct in
a vector; the scalars that could be left out at their default, the row count and the body length, are never
zero for a non-empty batch), so only the numbers in it change. A schema whose message does not fit that
shape (view types with variadic buffers) goes through pyarrow's writer, as LZ4 does: LZ4 sets up nothing
per buffer.

The body follows the Arrow format's BUFFER compression: each non-empty buffer is its uncompressed length
(int64, little-endian) then the compressed frame, padded to 8 bytes; an empty buffer stays empty. Every
Arrow reader (pyarrow, arrow-rs in pyfluss, Arrow Java) reads it.
"""

from __future__ import annotations

import functools
import struct
import threading
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import zstandard

from strom.table_properties import DEFAULT_ZSTD_LEVEL

CODECS: dict[str, Literal["lz4", "zstd"] | None] = {"NONE": None, "LZ4_FRAME": "lz4", "ZSTD": "zstd"}
"""Fluss's ``table.log.arrow.compression.type`` values and the codec each stands for."""

_CONTINUATION = 0xFFFFFFFF
_PREFIX = struct.Struct("<Ii")
_INT64 = struct.Struct("<q")
_UOFFSET = struct.Struct("<I")
_SOFFSET = struct.Struct("<i")
_VOFFSET = struct.Struct("<H")
_RECORD_BATCH = 3
"""MessageHeader.RecordBatch in Arrow's Message.fbs."""
_TEMPLATES_MAX = 1024


@dataclass(frozen=True, slots=True)
class ArrowCompression:
    """How an ARROW log batch's body is compressed: ``codec`` and, for ZSTD, its ``level``."""

    codec: Literal["lz4", "zstd"]
    level: int = DEFAULT_ZSTD_LEVEL

    @classmethod
    def of_table(cls, compression_type: str, zstd_level: int = DEFAULT_ZSTD_LEVEL) -> ArrowCompression | None:
        """The compression a table's options ask for; None for ``NONE``."""
        codec = CODECS[compression_type.upper()]
        return None if codec is None else cls(codec, zstd_level if codec == "zstd" else DEFAULT_ZSTD_LEVEL)


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the numbers of a RecordBatch message's metadata flatbuffer are (byte positions in it)."""

    length_at: int
    nodes_at: int
    node_count: int
    buffers_at: int
    buffer_count: int
    body_length_at: int


def _fields(meta: bytes, table: int) -> list[int]:
    """The field offsets of the flatbuffer table at ``table`` (0: the field is absent)."""
    vtable = table - _SOFFSET.unpack_from(meta, table)[0]
    vtable_size = _VOFFSET.unpack_from(meta, vtable)[0]
    return [_VOFFSET.unpack_from(meta, vtable + 4 + 2 * i)[0] for i in range((vtable_size - 4) // 2)]


def _field(fields: list[int], index: int) -> int:
    return fields[index] if index < len(fields) else 0


def _vector(meta: bytes, at: int) -> tuple[int, int]:
    """(first element's position, element count) of the vector referenced at ``at``."""
    vector = at + _UOFFSET.unpack_from(meta, at)[0]
    return vector + 4, _UOFFSET.unpack_from(meta, vector)[0]


def _layout(meta: bytes) -> _Layout | None:
    """The layout of a RecordBatch message's metadata; None for another message or a shape this module does
    not fill in (a row count or body length left out, variadic buffer counts)."""
    root = _UOFFSET.unpack_from(meta, 0)[0]
    message = _fields(meta, root)
    header_type, header, body_length = _field(message, 1), _field(message, 2), _field(message, 3)
    if not header_type or meta[root + header_type] != _RECORD_BATCH or not header or not body_length:
        return None
    batch = header_at = root + header
    batch += _UOFFSET.unpack_from(meta, header_at)[0]
    record_batch = _fields(meta, batch)
    length, nodes, buffers, variadic = (_field(record_batch, i) for i in (0, 1, 2, 4))
    if not length or not nodes or not buffers or variadic:
        return None
    nodes_at, node_count = _vector(meta, batch + nodes)
    buffers_at, buffer_count = _vector(meta, batch + buffers)
    return _Layout(batch + length, nodes_at, node_count, buffers_at, buffer_count, root + body_length)


def _split(message: bytes | memoryview) -> tuple[memoryview, memoryview]:
    """(metadata, body) of one encapsulated IPC message."""
    view = memoryview(message)
    continuation, meta_size = _PREFIX.unpack_from(view, 0)
    assert continuation == _CONTINUATION, "not an encapsulated Arrow IPC message"
    return view[8 : 8 + meta_size], view[8 + meta_size :]


@dataclass(frozen=True, slots=True)
class _Template:
    """The compressed message's metadata for one schema and codec, and where the numbers are in it and in
    the uncompressed message's metadata (whose layout, too, depends only on the schema)."""

    meta: bytes
    layout: _Layout
    plain: _Layout
    plain_size: int
    buffers: struct.Struct
    """The buffers vector's (offset, length) pairs."""


_templates: dict[tuple[pa.Schema, str], _Template | None] = {}
_compressors = threading.local()


@functools.cache
def _write_options(compression: ArrowCompression) -> pa.ipc.IpcWriteOptions:
    """pyarrow's writer options for ``compression``, made once. No thread pool: compressing a batch's few
    buffers in pyarrow's pool costs a hand-off per batch (measured: 72 µs → 38 µs for a 10-row batch)."""
    codec = pa.Codec(compression.codec, compression.level if compression.codec == "zstd" else None)
    return pa.ipc.IpcWriteOptions(compression=codec, use_threads=False)


def _pyarrow_message(batch: pa.RecordBatch, compression: ArrowCompression) -> bytes:
    """The message as pyarrow's compressing writer makes it: cut out of a one-batch stream (schema message,
    the batch, the end-of-stream marker)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=_write_options(compression)) as writer:
        writer.write_batch(batch)
    stream = sink.getvalue()
    _, schema_meta_size = _PREFIX.unpack_from(stream, 0)
    return stream[8 + schema_meta_size : stream.size - 8].to_pybytes()


def _template(batch: pa.RecordBatch, compression: ArrowCompression) -> _Template | None:
    key = (batch.schema, compression.codec)
    if key in _templates:
        return _templates[key]
    meta = bytes(_split(_pyarrow_message(batch, compression))[0])
    plain_meta = bytes(_split(batch.serialize())[0])
    layout, plain = _layout(meta), _layout(plain_meta)
    template = None
    if layout is not None and plain is not None and (layout.node_count, layout.buffer_count) == (
            plain.node_count, plain.buffer_count):
        template = _Template(meta, layout, plain, len(plain_meta), struct.Struct(f"<{2 * layout.buffer_count}q"))
    if len(_templates) >= _TEMPLATES_MAX:
        _templates.clear()
    _templates[key] = template
    return template


def _zstd(level: int) -> zstandard.ZstdCompressor:
    """This thread's ZSTD compressor of ``level``: it keeps its context from one frame to the next (pyarrow's
    codec makes a new one per buffer), and is not thread-safe."""
    compressors: dict[int, zstandard.ZstdCompressor] | None = getattr(_compressors, "by_level", None)
    if compressors is None:
        compressors = _compressors.by_level = {}
    compressor = compressors.get(level)
    if compressor is None:
        compressor = compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor


def compressed_message(batch: pa.RecordBatch, compression: ArrowCompression) -> bytes:
    """``batch`` (at least one row) as one encapsulated Arrow IPC RecordBatch message with its body buffers
    compressed."""
    assert batch.num_rows, "an empty batch has nothing to compress"
    if compression.codec != "zstd":  # LZ4 sets up nothing per buffer: pyarrow's writer is as fast
        return _pyarrow_message(batch, compression)
    template = _template(batch, compression)
    if template is None:
        return _pyarrow_message(batch, compression)
    meta, body = _split(batch.serialize())
    plain = template.plain
    if len(meta) != template.plain_size or _INT64.unpack_from(meta, plain.body_length_at)[0] != len(body):
        return _pyarrow_message(batch, compression)
    buffers = template.buffers.unpack_from(meta, plain.buffers_at)
    compress = _zstd(compression.level).compress
    placed: list[int] = []
    pieces: list[bytes] = []
    position = 0
    for offset, size in zip(buffers[::2], buffers[1::2], strict=True):
        placed.append(position)
        if not size:
            placed.append(0)
            continue
        frame = compress(body[offset : offset + size])
        piece_size = 8 + len(frame)
        padding = -piece_size % 8
        pieces += (_INT64.pack(size), frame, b"\0" * padding) if padding else (_INT64.pack(size), frame)
        placed.append(piece_size)
        position += piece_size + padding
    shape = template.layout
    filled = bytearray(template.meta)
    filled[shape.length_at : shape.length_at + 8] = meta[plain.length_at : plain.length_at + 8]
    nodes_size = 16 * shape.node_count
    filled[shape.nodes_at : shape.nodes_at + nodes_size] = meta[plain.nodes_at : plain.nodes_at + nodes_size]
    template.buffers.pack_into(filled, shape.buffers_at, *placed)
    _INT64.pack_into(filled, shape.body_length_at, position)
    return b"".join((_PREFIX.pack(_CONTINUATION, len(filled)), filled, *pieces))
