"""Write the seed corpora (fuzz/corpus/<target>/seed-NN): small valid inputs for every target.

    python -m fuzz.make_corpus

Deterministic, so rerunning it rewrites the same files; the files are committed.
"""

from __future__ import annotations

import random
import shutil
from decimal import Decimal

import pyarrow as pa

from fuzz import fuzz_log_batch
from fuzz.common import CORPUS_ROOT
from fuzz.rows import row_type_for
from strom.records import kv_batch, log_batch
from strom.records.compacted import CompactedRowEncoder
from strom.records.indexed import IndexedRowEncoder
from strom.rpc import framing
from strom.rpc.api_keys import ApiKey
from strom.rpc.messages import pb
from tests.records.row_values import random_row


def _log_records(rng: random.Random, compression: str | None, changelog: bool) -> bytes:
    count = rng.randint(1, 4)
    rows = {
        "id": [rng.randrange(-100, 100) for _ in range(count)],
        "name": [rng.choice(["a", "héllo", None, "x" * 20]) for _ in range(count)],
        "tags": [rng.choice([None, [], [1, -2]]) for _ in range(count)],
        "price": [rng.choice([None, Decimal("12.34")]) for _ in range(count)],
        "raw": [rng.choice([None, b"", b"\x00\xff"]) for _ in range(count)],
    }
    batch = pa.RecordBatch.from_pydict(rows, schema=fuzz_log_batch.SCHEMA)
    change_types = bytes(rng.choice([1, 2, 3, 4]) for _ in range(count)) if changelog else None
    return log_batch.build_arrow_batch(batch, schema_id=1, change_types=change_types, compression=compression)


def _kv_records(rng: random.Random) -> bytes:
    count = rng.randint(0, 4)
    keys = [rng.randbytes(rng.randint(1, 12)) for _ in range(count)]
    values = [None if rng.random() < 0.3 else rng.randbytes(rng.randint(1, 30)) for _ in range(count)]
    return kv_batch.build_kv_batch(1, keys, values)


def frames(rng: random.Random) -> list[bytes]:
    def frame(key: ApiKey, message: object, version: int = 0) -> bytes:
        return framing.encode_request(int(key), version, rng.randrange(1 << 20), message.SerializeToString())  # type: ignore[attr-defined]

    path = pb.PbTablePath(database_name="fluss", table_name="t")
    produce = pb.ProduceLogRequest(acks=-1, table_id=1, timeout_ms=30_000)
    produce.buckets_req.add(bucket_id=0, records=_log_records(rng, None, False))
    put = pb.PutKvRequest(acks=-1, table_id=1, timeout_ms=30_000)
    put.buckets_req.add(bucket_id=0, records=_kv_records(rng))
    lookup = pb.LookupRequest(table_id=1)
    lookup.buckets_req.add(bucket_id=0, keys=[b"\x01", b"\x02"])
    fetch = pb.FetchLogRequest(follower_server_id=-1, max_bytes=1 << 20, max_wait_ms=0)
    fetch.tables_req.add(table_id=1, projection_pushdown_enabled=False).buckets_req.add(bucket_id=0, fetch_offset=0, max_fetch_bytes=1 << 20)
    requests = [
        frame(ApiKey.API_VERSIONS, pb.ApiVersionsRequest(client_software_name="fuzz", client_software_version="0")),
        frame(ApiKey.LIST_DATABASES, pb.ListDatabasesRequest()),
        frame(ApiKey.CREATE_DATABASE, pb.CreateDatabaseRequest(database_name="d", ignore_if_exists=True)),
        frame(ApiKey.GET_TABLE_INFO, pb.GetTableInfoRequest(table_path=path)),
        frame(ApiKey.GET_METADATA, pb.MetadataRequest(table_path=[path])),
        frame(ApiKey.LIST_OFFSETS, pb.ListOffsetsRequest(follower_server_id=-1, offset_type=1, table_id=1, bucket_id=[0])),
        frame(ApiKey.PRODUCE_LOG, produce),
        frame(ApiKey.PUT_KV, put, 2),
        frame(ApiKey.LOOKUP, lookup, 1),
        frame(ApiKey.FETCH_LOG, fetch),
    ]
    # byte 0 sets the read size; one input is every request back to back
    return [bytes([rng.randrange(256)]) + r for r in requests] + [b"\x07" + b"".join(requests)]


def log_batches(rng: random.Random) -> list[bytes]:
    out = []
    for compression in (None, "zstd", "lz4"):
        for changelog in (False, True):
            out.append(b"\x01" + _log_records(rng, compression, changelog))
    out.append(b"\x00" + _log_records(rng, None, False) + _log_records(rng, "zstd", True))
    return out


def kv_batches(rng: random.Random) -> list[bytes]:
    out = [b"\x01" + _kv_records(rng) for _ in range(4)]
    out.append(b"\x00" + _kv_records(rng) + _kv_records(rng))
    out += [b"\x02" + kv_batch.build_value_batch([rng.randbytes(rng.randint(0, 20)) for _ in range(n)]) for n in (0, 1, 3)]
    return out


def rows(rng: random.Random, encoder_class: type) -> list[bytes]:
    out = []
    for seed in (0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987):
        row_type = row_type_for(seed)
        encoder = encoder_class(row_type)
        out.append(seed.to_bytes(2, "little") + encoder.encode(random_row(rng, row_type)))
    return out


def main() -> None:
    rng = random.Random(20261123)
    targets = {
        "frames": frames(rng),
        "log_batch": log_batches(rng),
        "kv_batch": kv_batches(rng),
        "compacted_row": rows(rng, CompactedRowEncoder),
        "indexed_row": rows(rng, IndexedRowEncoder),
    }
    for name, inputs in targets.items():
        directory = CORPUS_ROOT / name
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for index, data in enumerate(inputs):
            (directory / f"seed-{index:02d}").write_bytes(data)
        print(f"{name}: {len(inputs)} seeds, {sum(map(len, inputs))} bytes")


if __name__ == "__main__":
    main()
