"""Fluss's bucket assignment for keyed rows.

Clients pick the bucket and send it with every request, so the server needs this only to
route rows it writes itself (or to check a client). The default function hashes the
CompactedKeyEncoder bytes of the bucket-key columns with Flink's MurmurHash3 variant (seed
42, tail bytes mixed one at a time rather than as one partial block), rehashes the result as
an int, takes its absolute value and reduces it modulo the bucket count. Tables with a Paimon
or Iceberg lake format use the functions of those formats instead.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from strom.records.rowcodec_native import native

FLUSS_MURMUR_SEED = 42
ICEBERG_MURMUR_SEED = 0
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_N = 0xE6546B64
_MASK32 = 0xFFFFFFFF
_INT32_MIN = -(1 << 31)
_BLOCK = struct.Struct("<I")


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK32


def _mix_k(k: int) -> int:
    return (_rotl((k * _C1) & _MASK32, 15) * _C2) & _MASK32


def _mix_h(h: int, k: int) -> int:
    return (_rotl(h ^ k, 13) * 5 + _N) & _MASK32


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def _as_int32(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


def _full_blocks(data: bytes, seed: int) -> int:
    h = seed
    for (block,) in _BLOCK.iter_unpack(data[: len(data) & ~3]):
        h = _mix_h(h, _mix_k(block))
    return h


def fluss_hash_bytes(data: bytes) -> int:
    """Flink's MurmurHash3_32 variant with seed 42, as a signed int32."""
    h = _full_blocks(data, FLUSS_MURMUR_SEED)
    for byte in data[len(data) & ~3 :]:
        h = _mix_h(h, _mix_k(byte))
    return _as_int32(_fmix(h ^ len(data)))


def fluss_hash_int(value: int) -> int:
    """Flink's ``MathUtils.murmurHash(int)``: rehash an int, non-negative (MIN_INT gives 0)."""
    h = _mix_h(0, _mix_k(value & _MASK32))
    result = _as_int32(_fmix(h ^ 4))
    if result == _INT32_MIN:
        return 0
    return abs(result)


def murmur3_32(data: bytes, seed: int = ICEBERG_MURMUR_SEED) -> int:
    """Standard MurmurHash3_x86_32 (tail as one partial block), unsigned."""
    h = _full_blocks(data, seed)
    tail = data[len(data) & ~3 :]
    if tail:
        h ^= _mix_k(int.from_bytes(tail, "little"))
    return _fmix(h ^ len(data))


def _check(key_bytes: bytes, num_buckets: int) -> None:
    if not key_bytes:
        raise ValueError("bucket key bytes must not be empty")
    if num_buckets <= 0:
        raise ValueError(f"bucket count must be positive, got {num_buckets}")


def bucket_for_key(key_bytes: bytes, num_buckets: int) -> int:
    """Fluss's default bucket for the encoded bucket key (no lake format, or Lance)."""
    _check(key_bytes, num_buckets)
    return fluss_hash_int(fluss_hash_bytes(key_bytes)) % num_buckets


def paimon_bucket_for_key(key_bytes: bytes, num_buckets: int) -> int:
    """Bucket for tables whose lake format is Paimon: ``abs(hash % n)`` with Java's remainder."""
    _check(key_bytes, num_buckets)
    h = fluss_hash_bytes(key_bytes)
    remainder = abs(h) % num_buckets  # Java's % keeps the dividend's sign; abs() drops it
    return remainder


def iceberg_bucket_for_key(key_bytes: bytes, num_buckets: int) -> int:
    """Bucket for tables whose lake format is Iceberg: standard murmur3, seed 0."""
    _check(key_bytes, num_buckets)
    return (murmur3_32(key_bytes) & 0x7FFFFFFF) % num_buckets


def bucket_ids(keys: Sequence[bytes], bucket_count: int) -> list[int]:
    """``bucketing.bucket_for_key(key, bucket_count)`` of every key.

    Raises:
        ValueError: an empty key or a non-positive bucket count.
    """
    if native is not None and type(bucket_count) is int and 0 < bucket_count < 1 << 31:
        try:
            result: list[int] = native.bucket_ids(keys, bucket_count)
            return result
        except Exception:
            pass  # the reference raises its own error
    return [bucket_for_key(key, bucket_count) for key in keys]
