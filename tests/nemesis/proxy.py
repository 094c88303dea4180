"""A TCP proxy on loopback that the nemesis cuts, heals and slows: the network faults of a test cluster.

This machine's kernel has no ``netem`` qdisc, so partitions, delay and loss are made in user space: each
tablet server advertises a proxy's address instead of its own (every client and peer reaches it through
the proxy), and reaches ZooKeeper through a proxy of its own. The proxy tells which process opened each
connection (its peer's port, looked up in /proc: everything runs on loopback), so it can also cut the
connections of chosen processes alone: a partition between two servers is each one's proxy refusing the
other's pid. A cut connection behaves like a partition, not like a closed port: open connections go silent (nothing is forwarded either way, nothing is closed) and new ones
are accepted and then ignored, so the other side learns of it only from its own timeouts. Healing closes
the silenced connections (as a partition long enough for TCP to give up would) and forwards again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

CHUNK_BYTES = 64 << 10


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream one."""

    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    silenced: bool = False
    source_pid: int | None = None
    """The process that opened it, when it is one of the candidates the proxy was given."""


def owner_pid(peer_port: int, candidates: Iterable[int]) -> int | None:
    """Which of ``candidates`` holds the loopback TCP socket whose local port is ``peer_port``."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rpartition(":")[2], 16) == peer_port:
                    inode = fields[9]
                    break
        if inode is not None:
            break
    if inode is None:
        return None
    socket_link = f"socket:[{inode}]"
    for pid in candidates:
        with contextlib.suppress(OSError):
            for descriptor in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{descriptor}") == socket_link:
                        return pid
    return None


class FaultyProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; thread-safe controls, its own event loop thread."""

    def __init__(self, target_host: str, target_port: int, port: int = 0,
                 candidates: Callable[[], Iterable[int]] = tuple) -> None:
        """``candidates()``: the pids whose connections may be told apart (the cluster's processes)."""
        self.target = (target_host, target_port)
        self._candidates = candidates
        self._blocked: set[int] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"proxy-{target_port}", daemon=True)
        self._links: set[_Link] = set()
        self._cut = False
        self._delay_s = 0.0
        self._loss = 0.0
        self._random = random.Random(target_port)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", port), self._loop).result(10)
        self.port: int = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def retarget(self, host: str, port: int) -> None:
        """Forward new connections elsewhere (the member restarted on another port)."""
        self.target = (host, port)

    # ---- faults ----
    def cut(self) -> None:
        """A partition: nothing passes either way until :meth:`heal`."""
        self._call(self._set_cut, True)

    def block(self, pids: Iterable[int]) -> None:
        """A partition from these processes alone: their connections go silent until :meth:`heal`."""
        self._call(self._set_blocked, set(pids))

    def slow(self, delay_s: float, loss: float = 0.0) -> None:
        """Each forwarded chunk waits ``delay_s``; with ``loss``, that share of new connections is silenced
        (TCP hides a lost packet from the application: what is seen is a stalled connection)."""
        self._delay_s, self._loss = delay_s, loss

    def heal(self) -> None:
        self._delay_s, self._loss = 0.0, 0.0
        self._call(self._set_cut, False)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._call(self._close_all)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # ---- on the proxy's loop ----
    def _call(self, function: object, *args: object) -> None:
        if self._loop.is_closed():
            return
        async def run() -> None:
            result = function(*args)  # type: ignore[operator]
            if asyncio.iscoroutine(result):
                await result

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def _set_cut(self, cut: bool) -> None:
        self._cut = cut
        if cut:
            for link in self._links:
                link.silenced = True
        else:
            self._blocked = set()
            for link in [link for link in self._links if link.silenced]:
                self._drop(link)

    def _set_blocked(self, pids: set[int]) -> None:
        self._blocked |= pids
        for link in self._links:
            if link.source_pid in self._blocked:
                link.silenced = True

    async def _close_all(self) -> None:
        self._server.close()
        for link in list(self._links):
            self._drop(link)

    def _drop(self, link: _Link) -> None:
        self._links.discard(link)
        for writer in link.writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_port = writer.get_extra_info("peername")[1]
        source = await asyncio.to_thread(owner_pid, peer_port, list(self._candidates()))
        silenced = self._cut or source in self._blocked or (self._loss > 0 and self._random.random() < self._loss)
        link = _Link([writer], silenced=silenced, source_pid=source)
        self._links.add(link)
        if link.silenced:
            return  # held open, never answered: healing closes it
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._drop(link)
            return
        link.writers.append(upstream_writer)
        await asyncio.gather(self._pump(reader, upstream_writer, link), self._pump(upstream_reader, writer, link),
                             return_exceptions=True)
        self._drop(link)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link) -> None:
        while True:
            data = await reader.read(CHUNK_BYTES)
            if not data:
                break
            if self._delay_s:
                await asyncio.sleep(self._delay_s)
            while link.silenced:  # cut while open: hold what came, as a partitioned network would
                await asyncio.sleep(0.05)
                if link not in self._links:
                    return
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(Exception):
            writer.write_eof()
