"""ACLs in the ZooKeeper metadata store (the :class:`~strom.metadata.store.AclStore` contract), at Fluss's
nodes: ``/fluss-acls/<resource type code>/<resource name>``, one node per resource holding every ACL of it.

Adding or deleting ACLs rewrites the resources' nodes in one transaction, each guarded by the version it
was read at, so concurrent changes to one resource are applied one after the other, never lost.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import unquote

from strom.metadata.store import AclRecord, AclStore
from strom.zk.documents import AclEntry, acl_entries, acl_value, escape
from strom.zk.session import Transaction, ZooKeeperSession


class ZooKeeperAclStore(ZooKeeperSession, AclStore):
    """ACLs in ZooKeeper, grouped by resource."""

    def _acl_resource_path(self, resource_type: int, resource_name: str) -> str:
        return self._path(f"/fluss-acls/{resource_type}/{escape(resource_name)}")

    def _change_acls(self, records: Collection[AclRecord], add: bool) -> None:
        groups: dict[tuple[int, str], set[AclEntry]] = {}
        for r in records:
            groups.setdefault((r.resource_type, r.resource_name), set()).add(
                (r.principal_type, r.principal_name, r.host, r.operation, r.permission)
            )

        def change() -> None:
            transaction = Transaction(self._client)
            for (resource_type, resource_name), entries in sorted(groups.items()):
                type_path = self._path(f"/fluss-acls/{resource_type}")
                if add:
                    self._client.ensure_path(type_path)
                path = self._acl_resource_path(resource_type, resource_name)
                found = self._get(path)
                stored = set() if found is None else acl_entries(found[0])
                wanted = stored | entries if add else stored - entries
                if wanted == stored:
                    continue
                value = acl_value(wanted)
                if found is None:
                    transaction.create(path, value)
                elif wanted:
                    transaction.set_data(path, value, found[1].version)
                else:
                    transaction.delete(path, found[1].version)
            transaction.commit()

        self._run(change)

    def add_acls(self, records: Collection[AclRecord]) -> None:
        self._change_acls(records, add=True)

    def delete_acls(self, records: Collection[AclRecord]) -> None:
        self._change_acls(records, add=False)

    def list_acls(self) -> list[AclRecord]:
        def read() -> list[AclRecord]:
            root = self._path("/fluss-acls")
            types = self._children(root)
            names = self._children_many([f"{root}/{t}" for t in types])
            resources = [(int(t), unquote(n), f"{root}/{t}/{n}") for t, ns in zip(types, names, strict=True) for n in ns]
            values = self._get_many([path for *_, path in resources])
            return sorted(
                AclRecord(resource_type, resource_name, *entry)
                for (resource_type, resource_name, _), value in zip(resources, values, strict=True)
                if value is not None
                for entry in acl_entries(value)
            )

        return self._run(read)
