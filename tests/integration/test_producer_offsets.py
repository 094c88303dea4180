"""Producer offsets through a real server: strom's client registers, reads and deletes them; the raw
RPCs answer Fluss's result codes and errors; offsets expire by their TTL and survive a restart."""

from __future__ import annotations

import asyncio
import time

import pytest

from strom.client import Connection, RegisterResult, TableBucket, TablePath
from strom.errors import InvalidConfigError, InvalidProducerIdError, UnknownTableOrBucketError
from strom.rpc.api_keys import ApiKey
from strom.rpc.client import RpcConnection
from strom.rpc.messages import pb
from tests.conftest import unique_name
from tests.integration.snapshot_support import create_pk_table
from tests.server_process import ServerProcess

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def new_table_ids(address: str, count: int) -> list[int]:
    """The ids of ``count`` new tables: offsets are registered for tables that exist."""
    async with await Connection.create(address) as connection:
        return [(await create_pk_table(connection, TablePath("fluss", unique_name("offsets")), buckets=4))
                .layout.info.table_id for _ in range(count)]


async def test_a_producer_registers_reads_and_deletes_its_offsets(server: ServerProcess) -> None:
    producer = unique_name("query")
    first, second = await new_table_ids(server.address, 2)
    offsets = {TableBucket(first, 0): 120, TableBucket(first, 1): 0, TableBucket(second, 3, 40): 7}
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        assert await admin.get_producer_offsets(producer) is None
        assert await admin.register_producer_offsets(producer, offsets) is RegisterResult.CREATED
        assert await admin.register_producer_offsets(producer, {TableBucket(first, 0): 999}) is \
            RegisterResult.ALREADY_EXISTS
        found = await admin.get_producer_offsets(producer)
        assert found is not None and found.producer_id == producer and found.offsets == offsets
        assert found.expiration_time_ms > 0
        await admin.delete_producer_offsets(producer)
        await admin.delete_producer_offsets(producer)  # deleting what is gone succeeds
        assert await admin.get_producer_offsets(producer) is None
        with pytest.raises(InvalidProducerIdError, match="Invalid producer ID"):
            await admin.register_producer_offsets("no/slashes", offsets)
        with pytest.raises(InvalidConfigError):
            await admin.register_producer_offsets(producer, offsets, ttl_ms=-5)


async def test_offsets_expire_by_their_ttl_and_a_new_registration_replaces_them(server: ServerProcess) -> None:
    producer = unique_name("short")
    (table_id,) = await new_table_ids(server.address, 1)
    async with await Connection.create(server.address) as connection:
        admin = connection.get_admin()
        registered_at_ms = time.time() * 1000
        assert await admin.register_producer_offsets(producer, {TableBucket(table_id, 0): 5}, ttl_ms=1500) is \
            RegisterResult.CREATED
        found = await admin.get_producer_offsets(producer)
        assert found is None or found.expiration_time_ms <= registered_at_ms + 1500 + 5000  # None: already expired
        deadline = time.monotonic() + 30
        while await admin.get_producer_offsets(producer) is not None:  # expires 1.5 s after registration
            assert time.monotonic() < deadline, "the offsets never expired"
            await asyncio.sleep(0.1)
        assert await admin.register_producer_offsets(producer, {TableBucket(table_id, 0): 9}) is RegisterResult.CREATED
        renewed = await admin.get_producer_offsets(producer)
        assert renewed is not None and renewed.offsets == {TableBucket(table_id, 0): 9}
        assert renewed.expiration_time_ms - registered_at_ms > 3600_000  # the default TTL: 24 h
        await admin.delete_producer_offsets(producer)


async def test_the_wire_answers_fluss_codes(server: ServerProcess) -> None:
    """What a Fluss client sees: result 0/1, an empty answer for an unknown producer, error code 63, and
    code 21 for offsets of a table that does not exist."""
    (table_id,) = await new_table_ids(server.address, 1)
    host, port = server.address.rsplit(":", 1)
    rpc = await RpcConnection.connect(host, int(port))
    try:
        producer = unique_name("wire")
        request = pb.RegisterProducerOffsetsRequest(producer_id=producer, ttl_ms=60_000)
        request.table_offsets.add(table_id=table_id).bucket_offsets.add(bucket_id=0, log_end_offset=42)
        assert (await rpc.request(ApiKey.REGISTER_PRODUCER_OFFSETS, request)).result == 0
        assert (await rpc.request(ApiKey.REGISTER_PRODUCER_OFFSETS, request)).result == 1
        got = await rpc.request(ApiKey.GET_PRODUCER_OFFSETS, pb.GetProducerOffsetsRequest(producer_id=producer))
        assert got.producer_id == producer
        assert [(t.table_id, [(b.bucket_id, b.log_end_offset, b.HasField("partition_id")) for b in t.bucket_offsets])
                for t in got.table_offsets] == [(table_id, [(0, 42, False)])]
        unknown = await rpc.request(ApiKey.GET_PRODUCER_OFFSETS, pb.GetProducerOffsetsRequest(producer_id="nobody"))
        assert not unknown.HasField("producer_id") and not unknown.table_offsets
        with pytest.raises(InvalidProducerIdError) as refused:
            await rpc.request(ApiKey.DELETE_PRODUCER_OFFSETS, pb.DeleteProducerOffsetsRequest(producer_id=""))
        assert refused.value.code == 63
        missing_offset = pb.RegisterProducerOffsetsRequest(producer_id=producer + "-x")
        missing_offset.table_offsets.add(table_id=table_id).bucket_offsets.add(bucket_id=0)
        with pytest.raises(Exception, match="no log_end_offset"):
            await rpc.request(ApiKey.REGISTER_PRODUCER_OFFSETS, missing_offset)
        no_table = pb.RegisterProducerOffsetsRequest(producer_id=producer + "-y")
        no_table.table_offsets.add(table_id=table_id + 10_000).bucket_offsets.add(bucket_id=0, log_end_offset=1)
        with pytest.raises(UnknownTableOrBucketError, match=f"Table id {table_id + 10_000} does not exist") as unknown_table:
            await rpc.request(ApiKey.REGISTER_PRODUCER_OFFSETS, no_table)
        assert unknown_table.value.code == 21
        await rpc.request(ApiKey.DELETE_PRODUCER_OFFSETS, pb.DeleteProducerOffsetsRequest(producer_id=producer))
    finally:
        await rpc.close()


async def test_offsets_survive_a_restart(server_factory) -> None:  # type: ignore[no-untyped-def]
    process: ServerProcess = server_factory()
    (table_id,) = await new_table_ids(process.address, 1)
    async with await Connection.create(process.address) as connection:
        await connection.get_admin().register_producer_offsets("durable", {TableBucket(table_id, 1): 77})
    assert process.stop() == 0
    process.start()
    async with await Connection.create(process.address) as connection:
        found = await connection.get_admin().get_producer_offsets("durable")
    assert found is not None and found.offsets == {TableBucket(table_id, 1): 77}
