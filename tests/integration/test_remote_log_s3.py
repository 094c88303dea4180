"""Remote log storage on an S3-compatible object store (moto's server, on loopback): the server copies
segments with s3fs, strom's client reads the log whole across the remote/local boundary straight from the
bucket, a kill -9 and restart lose nothing, and dropping the table empties its prefix. Credentials and the
endpoint reach the server the way they reach any s3fs user: ``AWS_*`` and ``FSSPEC_S3_ENDPOINT_URL``."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from tests.integration.test_remote_log import (
    REMOTE_CONFIG,
    append,
    bucket_log_files,
    create_log_table,
    read_with_strom,
)
from tests.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.timeout(180)]

BUCKET = "strom-remote"
ROWS = 2000


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a process that uses the store; this test process gets it too (its fsspec config)."""
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "FSSPEC_S3_ENDPOINT_URL": s3_endpoint}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": s3_endpoint})
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return env


def wait_offloaded(server: ServerProcess, fs: Any, prefix: str, table_id: int) -> None:
    """Until the bucket's segments are in the store under ``prefix`` and at most 3 remain on local disk."""
    deadline = time.monotonic() + 60
    while len(bucket_log_files(server, table_id)) > 3 or not segment_objects(fs, prefix):
        assert time.monotonic() < deadline, "the segments never reached the object store"
        time.sleep(0.2)
        fs.invalidate_cache()


def segment_objects(fs: Any, prefix: str) -> list[str]:
    return [path for path in fs.find(prefix) if path.endswith(".log")] if fs.exists(prefix) else []


def test_a_log_tiered_to_an_object_store_reads_whole_and_survives_a_kill(tmp_path: Path, s3: dict[str, str]) -> None:
    root = f"s3://{BUCKET}/{tmp_path.name}"
    server = ServerProcess(tmp_path / "data", {**REMOTE_CONFIG, "remote.data.dir": root}, env=s3).start()
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    try:
        path, table_id = asyncio.run(create_log_table(server.address))
        asyncio.run(append(server.address, path, 0, ROWS))
        prefix = f"{BUCKET}/{tmp_path.name}/log/{path.database_name}/{path.table_name}-{table_id}"
        wait_offloaded(server, fs, prefix, table_id)
        assert int(bucket_log_files(server, table_id)[0].stem) > 0
        assert [r["seq"] for r in asyncio.run(read_with_strom(server.address, path, ROWS))] == list(range(ROWS))

        server.kill()
        server.start()
        assert [r["seq"] for r in asyncio.run(read_with_strom(server.address, path, ROWS))] == list(range(ROWS))

        async def drop() -> None:
            from strom.client import Connection

            async with await Connection.create(server.address) as connection:
                await connection.get_admin().drop_table(path)

        asyncio.run(drop())
        fs.invalidate_cache()
        assert segment_objects(fs, prefix) == []
    finally:
        server.stop()


@pytest.mark.parametrize("credentials", ["static", "sts"])
def test_pyfluss_reads_the_remote_segments_with_the_servers_security_token(
    tmp_path: Path, s3: dict[str, str], s3_endpoint: str, credentials: str
) -> None:
    """GetFileSystemSecurityToken hands pyfluss S3 credentials in Fluss's token format (the server's keys,
    or short-lived ones from STS), and pyfluss reads the segments only the bucket holds, unchanged. The
    server has its credentials and endpoint from Fluss's ``s3.*`` options alone, not the environment."""
    from strom.rpc.api_keys import ApiKey
    from strom.rpc.client import RpcConnection
    from strom.rpc.messages import pb
    from tests.integration.test_remote_log import read_with_pyfluss

    options = {"s3.access-key": s3["AWS_ACCESS_KEY_ID"], "s3.secret-key": s3["AWS_SECRET_ACCESS_KEY"],
               "s3.endpoint": s3_endpoint, "s3.region": "us-east-1", "s3.path.style.access": "true"}
    if credentials == "sts":
        options["s3.assumed.role.sts.endpoint"] = s3_endpoint
    root = f"s3://{BUCKET}/{tmp_path.name}"
    no_aws = {key: "" for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FSSPEC_S3_ENDPOINT_URL")}
    server = ServerProcess(tmp_path / "data", {**REMOTE_CONFIG, "remote.data.dir": root, **options}, env=no_aws).start()
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    try:
        path, table_id = asyncio.run(create_log_table(server.address))
        asyncio.run(append(server.address, path, 0, ROWS))
        prefix = f"{BUCKET}/{tmp_path.name}/log/{path.database_name}/{path.table_name}-{table_id}"
        wait_offloaded(server, fs, prefix, table_id)
        assert int(bucket_log_files(server, table_id)[0].stem) > 0, "the first segments are in the bucket only"

        async def token() -> Any:
            rpc = await RpcConnection.connect("127.0.0.1", server.port)
            try:
                return await rpc.request(ApiKey.GET_FILESYSTEM_SECURITY_TOKEN, pb.GetFileSystemSecurityTokenRequest())
            finally:
                await rpc.close()

        answer = asyncio.run(token())
        handed = json.loads(answer.token)
        assert answer.schema == "s3" and set(handed) == {"access_key_id", "access_key_secret", "security_token"}
        assert {kv.key: kv.value for kv in answer.addition_info}["fs.s3a.endpoint"] == s3_endpoint
        if credentials == "sts":
            assert handed["access_key_id"] != s3["AWS_ACCESS_KEY_ID"] and handed["security_token"]
            assert answer.expiration_time > time.time() * 1000, "short-lived: the client refreshes before then"
        else:
            assert handed["access_key_id"] == s3["AWS_ACCESS_KEY_ID"] and not answer.HasField("expiration_time")

        records = asyncio.run(read_with_pyfluss(server.address, path, ROWS))
        assert [r.offset for r in records] == list(range(ROWS)) and records[0].row["seq"] == 0
    finally:
        server.stop()
