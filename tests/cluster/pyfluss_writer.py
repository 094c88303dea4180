"""pyfluss upserting in a process of its own, so that a writer waiting on an unreachable leader holds up
nothing else in a test. Each key is upserted and flushed alone and printed once pyfluss reports it
acknowledged: the flush ended and the record's own result handle says it was written. A failed attempt is
retried (an upsert repeated with the same value changes nothing) and printed as an ``attempt ...`` line.
At the end the last key is looked up through pyfluss and printed as ``read <value>``. (What the process printed is its result: pyfluss 1.0.0 may end the interpreter
with status 255 after a leader died under it, after everything here has run.)

Usage: python pyfluss_writer.py BOOTSTRAP DATABASE TABLE FIRST COUNT TAG
(pyfluss's further options, a login on a secure cluster, as a JSON object in the environment variable
PYFLUSS_OPTIONS, so that no password shows in the process list)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import fluss

OPTIONS_VARIABLE = "PYFLUSS_OPTIONS"


async def write(bootstrap: str, database: str, table_name: str, first: int, count: int, tag: str) -> None:
    options = {**json.loads(os.environ.get(OPTIONS_VARIABLE, "{}")), "bootstrap.servers": bootstrap}
    connection = await fluss.FlussConnection.create(fluss.Config(options))
    try:
        table = await connection.get_table(fluss.TablePath(database, table_name))
        writer = table.new_upsert().create_writer()
        for key in range(first, first + count):
            for attempt in range(100):
                try:
                    acknowledged = writer.upsert({"id": key, "v": tag})
                    await writer.flush()
                    await acknowledged.wait()  # this record's own answer: a flush alone does not report a
                    break  # batch that failed before the flush began
                except fluss.FlussError as error:
                    print(f"attempt {attempt} for {key}: {error}", flush=True)
                    await asyncio.sleep(0.2)
                    writer = table.new_upsert().create_writer()
            else:
                raise SystemExit(f"{key} was never acknowledged")
            print(key, flush=True)
            await asyncio.sleep(0.02)
        found = await table.new_lookup().create_lookuper().lookup({"id": first + count - 1})
        print("read", None if found is None else found["v"], flush=True)
    finally:
        await connection.close()


if __name__ == "__main__":
    bootstrap, database, table_name, first, count, tag = sys.argv[1:7]
    asyncio.run(write(bootstrap, database, table_name, int(first), int(count), tag))
