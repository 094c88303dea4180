"""The entry point of strom's Python client: one :class:`Connection` per cluster.

Names mirror pyfluss (``Connection.create``, ``get_admin``, ``get_table``) so pyfluss users feel at home.
What it sends goes through :class:`~strom.client.rpc_client.ClusterRpc`; a connection adds the handles a
user opens on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from strom.client.admin import Admin
from strom.client.rpc_client import ClusterRpc
from strom.client.table import Table
from strom.ids import TablePath


class Connection(ClusterRpc):
    """A connection to a strom (or Fluss) cluster. Use ``async with`` or call :meth:`close`."""

    @classmethod
    async def create(cls, config: Mapping[str, str] | str) -> Connection:
        """Connect to the cluster; ``config`` is a client config mapping or just ``"host:port"``.

        Raises:
            ConnectionFailedError: no bootstrap server answered.
        """
        connection = cls({"bootstrap.servers": config} if isinstance(config, str) else config)
        try:
            await connection.metadata.refresh()
        except BaseException:
            await connection.close()
            raise
        return connection

    def get_admin(self) -> Admin:
        return Admin(self)

    async def get_table(self, table_path: TablePath) -> Table:
        """A handle on an existing table. Raises TableNotExistError."""
        info = await self.metadata.refresh_table(table_path)
        return Table(self, info)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


__all__ = ["Connection"]
