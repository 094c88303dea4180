"""Which coordinator is active: the ephemeral ZooKeeper node ``/coordinators/active`` (under the root) holding
Fluss's coordinator address (version 2: ``{"version": 2, "id": "0", "listeners": "NAME://host:port,…"}``) and
strom's ``"epoch"``.

Coordinators campaign for the node: the one that creates it is active, the others wait as standbys and try
again when it vanishes (its process stopped, or its session expired). Each win takes a new **coordinator
epoch** from a durable counter, so requests of a deposed coordinator carry an older epoch and are refused
(tablet servers keep the highest epoch they have seen). An active coordinator whose node disappears or
changes owner is deposed: it must stop acting at once (``on_deposed``). Tablet servers watch the node to
know where to send KV snapshot commits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kazoo.exceptions import KazooException, NodeExistsError
from kazoo.recipe.watchers import DataWatch

from strom.errors import InvalidConfigError, StorageError
from strom.membership.contract import ActiveCoordinator, FollowedCoordinator, RegisteredServer
from strom.rpc.endpoints import DEFAULT_LISTENER_NAME
from strom.zk.login import ZooKeeperLogin
from strom.zk.session import connect_kazoo, parse_location

log = logging.getLogger(__name__)

ACTIVE_PATH = "/coordinators/active"
CAMPAIGN_POLL_S = 0.5


class CoordinatorAddress(FollowedCoordinator):
    """Campaign for (coordinators) or follow (tablet servers) the active coordinator (a
    :class:`~strom.membership.contract.CoordinatorDirectory`). Thread-safe."""

    def __init__(self, location: str, session_timeout_ms: int = 6000, internal_listener: str = DEFAULT_LISTENER_NAME,
                 login: ZooKeeperLogin | None = None, on_deposed: Callable[[], None] | None = None) -> None:
        """``internal_listener``: :meth:`current` names the active coordinator by its endpoint there.
        ``on_deposed``: called (on a ZooKeeper thread) when this process was active and no longer is."""
        super().__init__(internal_listener, on_deposed)
        hosts, root = parse_location(location)
        self._path = root + ACTIVE_PATH
        self._client = connect_kazoo(hosts, session_timeout_ms, login=login)
        try:
            self._client.ensure_path(self._path.rsplit("/", 1)[0])
            DataWatch(self._client, self._path, self._on_data)
        except Exception as exc:
            self._client.close()
            raise StorageError(f"cannot follow the active coordinator in ZooKeeper at {hosts}: {exc}") from exc

    def campaign(self, server: RegisteredServer, next_epoch: Callable[[], int], stop: threading.Event) -> int | None:
        """Block until this process is the active coordinator (returns its epoch) or ``stop`` is set (None)."""
        while not stop.is_set():
            if not self._wait_for_vacancy(stop, CAMPAIGN_POLL_S):
                continue
            active = ActiveCoordinator(server, next_epoch())
            try:
                self._client.create(self._path, active.encode(), ephemeral=True)
            except NodeExistsError:
                continue  # another standby won this round
            except KazooException as exc:
                log.warning("campaign for the active coordinator failed, trying again: %r", exc)
                stop.wait(CAMPAIGN_POLL_S)
                continue
            self._won_as(active)
            return active.epoch
        return None

    def _on_data(self, data: bytes | None, _stat: object) -> None:
        active = None
        if data:
            try:
                active = ActiveCoordinator.decode(bytes(data))
            except (ValueError, KeyError, TypeError, InvalidConfigError):
                log.warning("ignoring an unreadable coordinator address %r", data)
        self._observed(active, "ZooKeeper node")

    def close(self) -> None:
        """Stop following; an active coordinator's node goes with the session."""
        self._leave()
        try:
            self._client.stop()
        finally:
            self._client.close()


__all__ = ["ACTIVE_PATH", "CoordinatorAddress"]
