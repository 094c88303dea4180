"""Which tablet servers are alive: each announces itself with an ephemeral ZooKeeper node.

A tablet server registers as ``/tabletservers/ids/<server id>`` under the cluster's root (``/fluss`` by
default, as Fluss's ``zookeeper.path.root``), holding Fluss's registration document (version 3):
``{"version": 3, "listeners": "CLIENT://host:port,INTERNAL://host:port", "register_timestamp": ms}``, every
listener's advertised endpoint (version 4 adds the server's ``memory_bytes``). The node is ephemeral: it lives as long as the registering client's ZooKeeper
session, so a server that stops, crashes or stays cut off longer than the session timeout drops out of
everyone's :meth:`TabletServerRegistry.live`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from strom.errors import InvalidConfigError, StorageError
from strom.membership.contract import (
    RegisteredServer,
    decode_registration,
    encode_registration,
    id_taken,
    notify_live_servers,
)
from strom.rpc.endpoints import DEFAULT_LISTENER_NAME
from strom.rpc.peers import ServerNode
from strom.zk.login import ZooKeeperLogin
from strom.zk.session import connect_kazoo, parse_location

log = logging.getLogger(__name__)

IDS_PATH = "/tabletservers/ids"


class TabletServerRegistry:  # a ServerRegistry
    """Tablet servers announce themselves with an ephemeral node /tabletservers/ids/<id> (under the root,
    default /fluss); the node vanishes with the server's ZooKeeper session.

    The registry opens its own ZooKeeper client (one session). :meth:`register` creates the ephemeral
    node of a server; :meth:`live` answers from a cache a ChildrenWatch on ``/tabletservers/ids`` keeps
    current (children changes are followed by reads of the nodes' values), so it is cheap to call often;
    being asynchronous, it lags a change by a ZooKeeper round trip or two.

    Session expiry: when the session expires (a partition longer than the session timeout), ZooKeeper
    deletes the registered nodes and kazoo reconnects with a new session. The registry listens to the
    connection state and, on the first reconnection after LOST, creates the nodes of the servers it
    registered again (and re-reads the live servers). Should another server have taken the id meanwhile,
    the registration is not re-created and the conflict is logged as an error.

    Thread-safe; the watch and the re-registration run on kazoo's callback threads.
    """

    def __init__(self, location: str, session_timeout_ms: int = 6000, internal_listener: str = DEFAULT_LISTENER_NAME,
                 login: ZooKeeperLogin | None = None) -> None:
        """``internal_listener``: the listener the servers reach each other on; :meth:`live` names each
        server by its endpoint there."""
        assert session_timeout_ms > 0
        self._internal_listener = internal_listener
        self._hosts, root = parse_location(location)
        self.root = root
        self._ids_path = root + IDS_PATH
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._registered: dict[int, RegisteredServer] = {}
        self._listeners: list[Callable[[dict[int, ServerNode]], None]] = []
        self._live: dict[int, ServerNode] = {}
        self._reregister_pending = False
        self._closed = False
        self._client = connect_kazoo(self._hosts, session_timeout_ms, login=login)
        try:
            self._client.ensure_path(self._ids_path)
            self._client.add_listener(self._on_state)
            # calls _on_children once now (filling the cache) and after every change of the children
            self._watch = ChildrenWatch(self._client, self._ids_path, self._on_children)
        except BaseException:
            self.close()
            raise

    def _server_path(self, server_id: int) -> str:
        return f"{self._ids_path}/{server_id}"

    # ---- registration ----
    def register(self, server: RegisteredServer) -> None:
        """Create the server's ephemeral node.

        Raises:
            InvalidConfigError: another live tablet server holds ``server.server_id``.
            StorageError: ZooKeeper could not be reached.
        """
        with self._lock:
            if self._closed:
                raise StorageError("the tablet server registry is closed")
        try:
            self._create(server)
        except KazooException as exc:
            raise StorageError(f"cannot register tablet server {server.server_id} in ZooKeeper: {exc!r}") from exc
        with self._lock:
            self._registered[server.server_id] = server
        self._refresh()

    def _create(self, server: RegisteredServer) -> None:
        """Create the ephemeral node; one left by our own session (a retried create) counts as created."""
        path = self._server_path(server.server_id)
        value = encode_registration(server)
        while True:
            try:
                self._client.retry(self._client.create, path, value, ephemeral=True)
                return
            except NodeExistsError:
                pass
            try:
                data, stat = self._client.retry(self._client.get, path)
            except NoNodeError:
                continue  # its owner's session ended meanwhile: try again
            session = self._client.client_id
            if session is not None and stat.ephemeralOwner == session[0] and bytes(data) == value:
                return
            try:
                holder: RegisteredServer | None = decode_registration(server.server_id, bytes(data))
            except (ValueError, KeyError, TypeError, InvalidConfigError):
                holder = None
            raise id_taken(server, holder)

    # ---- live servers ----
    @property
    def client(self) -> KazooClient:
        """The registry's ZooKeeper client, shared by the process's other cluster state (bucket states)."""
        return self._client

    def add_listener(self, listener: Callable[[dict[int, ServerNode]], None]) -> None:
        """Call ``listener(live servers)`` (on a ZooKeeper thread) after every change of the live servers."""
        self._listeners.append(listener)

    def live(self) -> dict[int, ServerNode]:
        """The currently registered servers by id, each at its internal listener's endpoint (from the
        watch's cache: no ZooKeeper call). A server registered without the internal listener is left out:
        the others could not reach it."""
        return dict(self._live)

    def _on_children(self, children: list[str]) -> None:
        self._refresh()

    def _refresh(self) -> None:
        """Re-read the registered servers into the cache; on a ZooKeeper failure the cache stays as it was
        (the next change, or the next reconnection, refreshes it)."""
        with self._refresh_lock:
            if self._closed:
                return
            try:
                names = [name for name in self._client.get_children(self._ids_path) if name.isdigit()]
                pending = [(int(name), self._client.get_async(self._server_path(int(name)))) for name in names]
                servers: dict[int, ServerNode] = {}
                for server_id, result in pending:
                    try:
                        data, _stat = result.get()
                    except NoNodeError:
                        continue  # gone since the listing
                    try:
                        node = decode_registration(server_id, bytes(data)).node(self._internal_listener)
                    except (ValueError, KeyError, TypeError, InvalidConfigError):
                        log.warning("ignoring tablet server registration %s with value %r", server_id, data)
                        continue
                    if node is None:
                        log.warning("ignoring tablet server %s: it has no %s listener (internal.listener.name) "
                                    "in its registration %r", server_id, self._internal_listener, data)
                        continue
                    servers[server_id] = node
            except NoNodeError:
                servers = {}
            except KazooException as exc:
                if not self._closed:
                    log.info("could not read the live tablet servers (%r); keeping the last view", exc)
                return
            changed = servers != self._live
            self._live = servers
        if changed:
            notify_live_servers(self._listeners, servers)

    # ---- session changes ----
    def _on_state(self, state: str) -> None:
        """Called on kazoo's connection thread: must not block, so the work is spawned."""
        if self._closed:
            return
        if state == KazooState.LOST:
            self._reregister_pending = True
        elif state == KazooState.CONNECTED:
            self._client.handler.spawn(self._after_reconnect)

    def _after_reconnect(self) -> None:
        if self._reregister_pending and not self._closed:
            self._reregister_pending = False
            with self._lock:
                servers = list(self._registered.values())
            for server in servers:
                try:
                    self._create(server)
                    log.info("tablet server %s registered again after its ZooKeeper session expired",
                             server.server_id)
                except InvalidConfigError as exc:
                    log.error("tablet server %s lost its registration: %s", server.server_id, exc)
                    with self._lock:
                        self._registered.pop(server.server_id, None)
                except KazooException as exc:
                    # the connection dropped again: the next reconnection retries
                    log.info("registering tablet server %s again failed (%r)", server.server_id, exc)
                    self._reregister_pending = True
        self._refresh()

    def close(self) -> None:
        """Stop the client; its session ends, so the servers it registered leave at once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._client.stop()
        finally:
            self._client.close()


__all__ = ["TabletServerRegistry"]
