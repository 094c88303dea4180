"""Where the cluster's coordinator answers: an ephemeral ZooKeeper node ``/coordinators/active`` (under the
root) holding ``{"id", "host", "port"}``, written by the coordinator and watched by tablet servers, which
send it KV snapshot commits and name it in their metadata answers.

One coordinator per cluster for now: a second one refuses to start while the node is held.
"""

from __future__ import annotations

import json
import logging
import threading

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError
from kazoo.recipe.watchers import DataWatch

from strom.cluster.registry import RegisteredServer
from strom.errors import InvalidConfigError, StorageError
from strom.metadata.zookeeper_store import CONNECT_TIMEOUT_MS_DEFAULT, parse_location

log = logging.getLogger(__name__)

ACTIVE_PATH = "/coordinators/active"


def _encode(node: RegisteredServer) -> bytes:
    return json.dumps({"id": node.server_id, "host": node.host, "port": node.port}, sort_keys=True).encode()


def _decode(data: bytes) -> RegisteredServer:
    value = json.loads(data)
    return RegisteredServer(int(value["id"]), str(value["host"]), int(value["port"]))


class CoordinatorAddress:
    """Publish (coordinator) or follow (tablet servers) the active coordinator's address. Thread-safe."""

    def __init__(self, location: str, session_timeout_ms: int = 6000) -> None:
        hosts, root = parse_location(location)
        self._path = root + ACTIVE_PATH
        self._published: RegisteredServer | None = None
        self._current: RegisteredServer | None = None
        self._changed = threading.Condition()
        self._client = KazooClient(
            hosts=hosts, timeout=session_timeout_ms / 1000,
            connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 1.0},
        )
        try:
            self._client.start(timeout=CONNECT_TIMEOUT_MS_DEFAULT / 1000)
            self._client.ensure_path(self._path.rsplit("/", 1)[0])
            self._client.add_listener(self._on_state)
            DataWatch(self._client, self._path, self._on_data)
        except Exception as exc:
            self._client.close()
            raise StorageError(f"cannot follow the coordinator's address in ZooKeeper at {hosts}: {exc}") from exc

    def publish(self, node: RegisteredServer) -> None:
        """Claim the active coordinator's node. Raises InvalidConfigError while another coordinator holds it."""
        try:
            self._client.create(self._path, _encode(node), ephemeral=True)
        except NodeExistsError:
            holder = self.current()
            raise InvalidConfigError(
                f"another coordinator is active at {holder.host}:{holder.port}" if holder else "another coordinator is active"
            ) from None
        except KazooException as exc:
            raise StorageError(f"cannot publish the coordinator's address: {exc!r}") from exc
        self._published = node

    def current(self) -> RegisteredServer | None:
        """The active coordinator (from the watch's cache), None while there is none."""
        return self._current

    def wait(self, timeout_s: float) -> RegisteredServer | None:
        """The active coordinator, waiting up to ``timeout_s`` for one to appear."""
        with self._changed:
            self._changed.wait_for(lambda: self._current is not None, timeout_s)
            return self._current

    def _on_data(self, data: bytes | None, _stat: object) -> None:
        node = None
        if data:
            try:
                node = _decode(bytes(data))
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring an unreadable coordinator address %r", data)
        with self._changed:
            self._current = node
            self._changed.notify_all()

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED and self._published is not None:
            self._client.handler.spawn(self._republish)

    def _republish(self) -> None:
        """After a session expiry the ephemeral node is gone: claim it again."""
        node = self._published
        if node is None:
            return
        try:
            self._client.create(self._path, _encode(node), ephemeral=True)
            log.info("coordinator address published again after a ZooKeeper session change")
        except NodeExistsError:
            pass  # still ours (the session survived) or another coordinator's
        except KazooException as exc:
            log.warning("could not publish the coordinator's address again: %r", exc)

    def close(self) -> None:
        try:
            self._client.stop()
        finally:
            self._client.close()


__all__ = ["ACTIVE_PATH", "CoordinatorAddress"]
