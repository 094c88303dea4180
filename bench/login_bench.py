"""What logins and TLS cost: a server's mutual login (STROM-INTERNAL, two rounds and four HMACs) against a
client's SASL/PLAIN login on the same server in the same run, and the write and lookup throughput of strom's
client over TLS against the same server process kind without it.

    python -m bench.login_bench [--logins 2000] [--rows 200000] [--lookups 50000]

Logins are timed from the client (connect, ApiVersions, the login, close) and on the server (its CPU time
for all of them, from /proc, divided by their number). The plain TCP connection without any login is the
ceiling each login is set against.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from bench.harness import BenchServer, median, percentile, process_cpu_s, report
from strom.client import Connection, Schema, TableDescriptor, TablePath
from strom.rpc.client import RpcConnection
from strom.security.credentials import SaslCredentials
from strom.security.internal import InternalCredentials

SECRET = "bench-internal-secret"
PASSWORD = "bench-password"
JAAS = f'org.apache.fluss.security.auth.sasl.plain.PlainLoginModule required user_bench="{PASSWORD}";'
BATCH_KEYS = 1_000


async def _logins(server: BenchServer, count: int, credentials: object | None) -> tuple[list[float], float]:
    """Connect and close ``count`` times with ``credentials``; the client's latencies (µs) and the server's
    CPU seconds per login."""
    host, _, port = server.address.rpartition(":")
    assert server.process is not None
    cpu_before = process_cpu_s(server.process.pid)
    latencies = []
    for _ in range(count):
        begin = time.perf_counter_ns()
        connection = await RpcConnection.connect(host, int(port), credentials=credentials)  # type: ignore[arg-type]
        latencies.append((time.perf_counter_ns() - begin) / 1000)
        await connection.close()
    await asyncio.sleep(0.2)
    return latencies, (process_cpu_s(server.process.pid) - cpu_before) / count


def _certificates(directory: Path) -> dict[str, str]:
    """A private CA and a server certificate for 127.0.0.1 (openssl), as server settings."""
    def openssl(*arguments: str) -> None:
        subprocess.run(["openssl", *arguments], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", "/CN=bench-ca", "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "san.ext", "-out", "server.pem")
    return {"security.protocol.map": "FLUSS:SSL", "security.ssl.certificate": str(directory / "server.pem"),
            "security.ssl.key": str(directory / "server.key"), "security.ssl.truststore": str(directory / "ca.pem")}


async def _throughput(config: dict[str, object], rows: pa.Table, lookups: list[int]) -> tuple[float, float]:
    """Upserted rows/s (durable) and looked-up keys/s (lookup_arrow of 1 000) through strom's client."""
    async with await Connection.create(config) as connection:  # type: ignore[arg-type]
        path = TablePath("fluss", "tls_bench")
        schema = Schema.from_arrow(rows.schema, primary_key=["id"])
        await connection.get_admin().create_table(path, TableDescriptor(schema, bucket_count=2))
        table = await connection.get_table(path)
        writer = table.new_upsert().create_writer()
        start = time.perf_counter()
        for batch in rows.to_batches(max_chunksize=10_000):
            writer.upsert_arrow_batch(batch)
        await writer.flush()
        written = rows.num_rows / (time.perf_counter() - start)
        lookuper = table.new_lookup().create_lookuper()
        keys = pa.table({"id": pa.array(lookups, pa.int64())})
        start = time.perf_counter()
        for offset in range(0, len(lookups), BATCH_KEYS):
            await lookuper.lookup_arrow(keys.slice(offset, BATCH_KEYS))
        return written, len(lookups) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logins", type=int, default=2_000)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--lookups", type=int, default=50_000)
    args = parser.parse_args()

    secured = {"security.protocol.map": "FLUSS:SASL", "security.sasl.enabled.mechanisms": "PLAIN",
               "security.sasl.plain.jaas.config": JAAS, "security.internal.secret": SECRET,
               "kv.snapshot.interval": "0s", "security.failed-authentication.max-per-address": "0"}
    with BenchServer(secured) as server:
        plain_tcp, plain_cpu = asyncio.run(_logins(server, args.logins, None))  # ApiVersions only, no login
        plain, plain_login_cpu = asyncio.run(_logins(server, args.logins, SaslCredentials("bench", PASSWORD)))
        internal, internal_cpu = asyncio.run(
            _logins(server, args.logins, InternalCredentials(SECRET, "tablet-server-1", "coordinator")))
    report(f"logins, {args.logins:,} each, one client after another (client p50 / p99; server CPU per login)", [
        ("connect + ApiVersions, no login (ceiling)",
         f"{median(plain_tcp):.0f} / {percentile(plain_tcp, 0.99):.0f} µs; {plain_cpu * 1e6:.0f} µs CPU"),
        ("SASL/PLAIN login (a client)",
         f"{median(plain):.0f} / {percentile(plain, 0.99):.0f} µs; {plain_login_cpu * 1e6:.0f} µs CPU; "
         f"ratio {median(plain) / median(plain_tcp):.2f}"),
        ("STROM-INTERNAL mutual login (a server)",
         f"{median(internal):.0f} / {percentile(internal, 0.99):.0f} µs; {internal_cpu * 1e6:.0f} µs CPU; "
         f"ratio {median(internal) / median(plain_tcp):.2f}, {median(internal) / median(plain):.2f} of PLAIN"),
    ])

    rng = random.Random(5)
    rows = pa.table({"id": pa.array(range(args.rows), pa.int64()),
                     "v": pa.array([f"value-{i:08d}" for i in range(args.rows)])})
    lookups = [rng.randrange(args.rows) for _ in range(args.lookups)]
    with tempfile.TemporaryDirectory(prefix="strom-tls-bench-") as directory:
        tls = _certificates(Path(directory))
        results = {}
        for name, config, client in (
            ("plaintext", {}, {}),
            ("TLS", tls, {"client.security.protocol": "SSL", "client.security.ssl.truststore": tls["security.ssl.truststore"]}),
        ):
            with BenchServer({"kv.snapshot.interval": "0s", **config}) as server:
                results[name] = asyncio.run(_throughput({"bootstrap.servers": server.address, **client}, rows, lookups))
    (plain_write, plain_lookup), (tls_write, tls_lookup) = results["plaintext"], results["TLS"]
    report(f"TLS, strom's client, {args.rows:,} rows upserted, {args.lookups:,} keys looked up 1 000 at a time", [
        ("upserts, plaintext / TLS", f"{plain_write:,.0f} / {tls_write:,.0f} rows/s; ratio {tls_write / plain_write:.2f}"),
        ("lookups, plaintext / TLS", f"{plain_lookup:,.0f} / {tls_lookup:,.0f} keys/s; ratio {tls_lookup / plain_lookup:.2f}"),
    ])


if __name__ == "__main__":
    main()
