"""The lake snapshots of lake-enabled tables in the ZooKeeper metadata store (the
:class:`~strom.metadata.store.LakeSnapshotStore` contract).

A table's snapshots are sequential children ``<snapshot id>-<seq>`` of its ``laketable`` node: the sequence
ZooKeeper appends orders them by commit (lake snapshot ids need not grow; Iceberg's are random). A commit
bumps the ``laketable`` node's version in its transaction, which fences a concurrent commit that read the
same children.
"""

from __future__ import annotations

from collections.abc import Collection

from strom.metadata.store import LakeSnapshotRecord, LakeSnapshotStore
from strom.zk.documents import lake_children_by_commit, lake_record, lake_value
from strom.zk.session import Conflict, Transaction, ZooKeeperSession, check_value_size


class ZooKeeperLakeStore(ZooKeeperSession, LakeSnapshotStore):
    """Lake snapshots in ZooKeeper, under each table id's node."""

    def _laketable_path(self, table_id: int) -> str:
        return f"{self._table_id_path(table_id)}/laketable"

    def commit_lake_snapshot(
        self, record: LakeSnapshotRecord, discard_snapshot_ids: Collection[int] = ()
    ) -> list[LakeSnapshotRecord]:
        assert record.snapshot_id not in discard_snapshot_ids, "a snapshot cannot replace and discard itself"
        parent = self._laketable_path(record.table_id)
        value = lake_value(record)
        check_value_size(parent, value)

        def commit() -> list[LakeSnapshotRecord]:
            found = self._get(parent)
            if found is None:
                self._client.ensure_path(parent)
                raise Conflict(parent)
            stat = found[1]
            children = lake_children_by_commit(self._children(parent))
            transaction = Transaction(self._client)
            # bumping the parent's version fences a concurrent commit that read the same children
            transaction.set_data(parent, b"", stat.version)
            discarded = []
            for snapshot_id in discard_snapshot_ids:
                for child_id, name in children:
                    if child_id == snapshot_id:
                        data = self._get(f"{parent}/{name}")
                        if data is None:
                            raise Conflict(name)
                        discarded.append(lake_record(record.table_id, snapshot_id, data[0]))
                        transaction.delete(f"{parent}/{name}")
            for child_id, name in children:
                if child_id == record.snapshot_id:
                    transaction.delete(f"{parent}/{name}")
            transaction.create(f"{parent}/{record.snapshot_id}-", value, sequence=True)
            transaction.commit()
            return discarded

        return self._run(commit)

    def list_lake_snapshot_ids(self, table_id: int) -> list[int]:
        names = self._run(lambda: self._children(self._laketable_path(table_id)))
        return [snapshot_id for snapshot_id, _ in lake_children_by_commit(names)]

    def get_lake_snapshot(
        self, table_id: int, snapshot_id: int | None = None, readable: bool = False
    ) -> LakeSnapshotRecord | None:
        parent = self._laketable_path(table_id)

        def read() -> LakeSnapshotRecord | None:
            children = lake_children_by_commit(self._children(parent))
            for child_id, name in reversed(children):
                if snapshot_id is not None and child_id != snapshot_id:
                    continue
                found = self._get(f"{parent}/{name}")
                if found is None:
                    raise Conflict(name)
                record = lake_record(table_id, child_id, found[0])
                if record.readable or not readable:
                    return record
            return None

        return self._run(read)
