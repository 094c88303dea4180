"""Lance through pylance: the lake copy of a strom log table as a Lance dataset, laid out as Fluss's
Lance tiering lays it out.

What Fluss does, from its ``fluss-lake-lance`` module (facts this module follows):

- Only log tables tier into Lance; a primary-key table is refused ("we don't support tiering a primary
  key table to Lance").
- The dataset lives at ``<warehouse>/<database>/<table>.lance``; ``warehouse`` is the one required option,
  the others are passed to Lance as storage options, and ``max_row_per_file``, ``max_rows_per_group`` and
  ``max_bytes_per_file`` size the files a writer cuts.
- A writer writes fragments without committing; the committer appends every fragment of a round in one
  Lance transaction whose transaction properties carry the committer's properties (the ``fluss-offsets``
  path) and ``commit-user`` = ``__fluss_lake_tiering``. The Lance version is the lake snapshot id, and the
  missing-commit lookup walks the versions newest first for that commit user.
- Column names must not contain a period (Lance cannot store them).

Where strom differs: the dataset also has Fluss's three system columns at the end (``__bucket``,
``__offset``, ``__timestamp``, as in strom's other lake formats), because a union read takes one bucket
of the lake and needs them; readers that select the table's columns see Fluss's layout. Types follow
strom's lake layout (:mod:`strom.lake.layout`): timestamps in microseconds, BINARY(n) as variable binary.
A commit applies only to the version its round was planned on: a Lance commit lock refuses any other
version, where Lance would otherwise rebase one append over another.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from types import EllipsisType
from typing import Any

import lance
import pyarrow as pa
from lance import LanceDataset, LanceOperation
from lance.commit import CommitConflictError
from lance.fragment import FragmentMetadata, write_fragments

from strom.errors import InvalidConfigError, InvalidTableError
from strom.ids import TableBucket
from strom.lake.commit_lock import exclusive, is_local
from strom.lake.delta_files import FileLimits
from strom.lake.format import (
    COMMIT_USER,
    COMMIT_USER_PROPERTY,
    CURRENT,
    CommittedLakeSnapshot,
    LakeCommitConflictError,
    LakeFormat,
    LakeStats,
    LakeTable,
    LakeTableMismatchError,
    LakeWriter,
    LakeWriteResult,
    commit_base,
)
from strom.lake.layout import SYSTEM_COLUMNS, LakeLayout
from strom.lake.locations import filesystem, pin_warehouse
from strom.metadata.table_info import TableInfo
from strom.table_properties import datalake_option_prefix

__all__ = ["LanceLakeFormat", "LanceLakeTable", "LanceLakeWriter"]

log = logging.getLogger(__name__)

TABLE_ID_METADATA = "strom.table-id"
"""Key in the dataset's schema metadata: which strom table this lake copy belongs to."""
DATASET_SUFFIX = ".lance"
FILE_SIZE_OPTIONS = {"max_row_per_file": "max_rows_per_file", "max_rows_per_group": "max_rows_per_group",
                     "max_bytes_per_file": "max_bytes_per_file"}
"""Fluss's Lance write options -> pylance's ``write_fragments`` arguments."""
READ_OPTIONS = ("batch_size", "block_size", "version")
"""Fluss's Lance options that are not storage options (strom's reads and writes size themselves)."""
_DATA_DIRECTORY = "data"


class LanceLakeFormat(LakeFormat):
    """Options (``table.datalake.lance.<key>``): ``warehouse`` (a local directory or a URI), Fluss's file
    sizes (``max_row_per_file``, ``max_rows_per_group``, ``max_bytes_per_file``); every other key is a
    Lance storage option (e.g. ``aws_region``)."""

    identifier = "lance"

    def __init__(self, options: Mapping[str, str], limits: FileLimits | None = None) -> None:
        options = {key: value for key, value in options.items() if value is not None}
        self.warehouse = pin_warehouse(options.pop("warehouse", ""))
        if not self.warehouse:
            raise InvalidConfigError(
                "the lance lake format needs 'table.datalake.lance.warehouse' (server option datalake.lance.warehouse)"
            )
        self.file_sizes: dict[str, int] = {}
        for key, argument in FILE_SIZE_OPTIONS.items():
            if key in options:
                text = options.pop(key)
                try:
                    self.file_sizes[argument] = int(text)
                except ValueError:
                    raise InvalidConfigError(
                        f"{datalake_option_prefix(self.identifier)}{key} must be an integer, got {text!r}"
                    ) from None
        self.storage_options = {key: value for key, value in options.items() if key not in READ_OPTIONS}
        self.limits = limits or FileLimits()

    def table(self, info: TableInfo) -> LanceLakeTable:
        path = info.path
        uri = f"{self.warehouse}/{path.database_name}/{path.table_name}{DATASET_SUFFIX}"
        table = LanceLakeTable(LakeLayout(info, native_time=True), uri, self.storage_options, self.file_sizes,
                               self.limits)
        table.ensure_created()
        return table


class LanceLakeTable(LakeTable):
    """One strom log table's Lance dataset. Opens the dataset for every call (a held one would hide
    other commits); pickles as its layout, URI and options."""

    def __init__(self, layout: LakeLayout, uri: str, storage_options: Mapping[str, str],
                 file_sizes: Mapping[str, int], limits: FileLimits) -> None:
        self.layout = layout
        self._uri = uri
        self.storage_options = dict(storage_options)
        self.file_sizes = dict(file_sizes)
        self.limits = limits

    @property
    def uri(self) -> str:
        return self._uri

    def dataset(self, version: int | None = None) -> LanceDataset:
        return lance.dataset(self._uri, version=version, storage_options=self.storage_options or None)

    # ---- creating ----
    def ensure_created(self) -> None:
        """Create the empty dataset (version 1) if absent, then check it is this strom table's copy.

        Raises:
            InvalidTableError: a primary-key table, or a column Lance cannot store.
            LakeTableMismatchError: another strom table id or another schema.
        """
        info = self.layout.info
        if info.has_primary_key:
            raise InvalidTableError(
                f"table '{info.path}' has a primary key: Lance holds log tables only (as in Fluss), tier it into "
                f"delta or iceberg"
            )
        self.layout.validate()
        dotted = [name for name in self.layout.row_type.field_names if "." in name]
        if dotted:
            raise InvalidTableError(f"table '{info.path}': Lance cannot store columns whose names contain a period {dotted}")
        with exclusive(self._uri):  # a second create would land as an overwrite, over any rows tiered since
            try:
                dataset = self.dataset()
            except (OSError, ValueError):
                schema = self.layout.schema.with_metadata({TABLE_ID_METADATA: str(info.table_id)})
                try:
                    dataset = lance.write_dataset(schema.empty_table(), self._uri, mode="create",
                                                  storage_options=self.storage_options or None)
                except (OSError, ValueError):
                    dataset = self.dataset()  # another process created it first; checked below like any dataset
        self._check_is_ours(dataset)

    def _check_is_ours(self, dataset: LanceDataset) -> None:
        info = self.layout.info
        metadata = dataset.schema.metadata or {}
        owner = metadata.get(TABLE_ID_METADATA.encode(), b"").decode() or None
        if owner != str(info.table_id):
            raise LakeTableMismatchError(
                f"the Lance dataset {self._uri} belongs to strom table id {owner}, not to '{info.path}' (id "
                f"{info.table_id}): a table of that name was dropped and re-created; move the old dataset away"
            )
        actual = [(f.name, str(f.type)) for f in dataset.schema]
        expected = [(f.name, str(f.type)) for f in self.layout.schema]
        if actual != expected:
            raise LakeTableMismatchError(f"the Lance dataset {self._uri} has columns {actual}; '{info.path}' needs {expected}")

    # ---- writing ----
    def writer(self, bucket: TableBucket, partition_name: str | None, base_snapshot_id: int | None) -> LanceLakeWriter:
        return LanceLakeWriter(self, bucket, partition_name, base_snapshot_id)

    def latest_snapshot_id(self) -> int | None:
        return int(self.dataset().version)

    def commit(
        self, results: Sequence[LakeWriteResult], properties: Mapping[str, str],
        base_snapshot_id: int | EllipsisType | None = CURRENT,
    ) -> int:
        """One Lance append of every result's fragments at the version after the base; ``properties`` and
        the commit user are the transaction's properties.

        Raises:
            LakeCommitConflictError: the dataset moved past the base (nothing of this commit is visible).
        """
        bases = set()
        for result in results:
            assert result.bucket.table_id == self.layout.info.table_id, (result.bucket, self.layout.info.table_id)
            bases.add(json.loads(result.payload)["base"])
        resolved = commit_base(bases, base_snapshot_id)
        current = self.dataset().version
        base = current if resolved is CURRENT or resolved is None else resolved
        if current != base:
            raise LakeCommitConflictError(
                f"lake commit to {self._uri} refused: the dataset is at version {current}, the round was written "
                f"against {base}"
            )
        fragments = [FragmentMetadata.from_json(json.dumps(fragment))
                     for result in results for fragment in json.loads(result.payload)["fragments"]]
        transaction = lance.Transaction(
            read_version=base, operation=LanceOperation.Append(fragments),
            transaction_properties={**properties, COMMIT_USER_PROPERTY: COMMIT_USER},
        )
        # A local dataset gets a lock that makes the commit a compare-and-set on the version; an object
        # store's own atomic commit (Lance's default there) refuses a second writer of the same version,
        # and a rebase over a commit that landed since the check above is reported below.
        commit_lock = _only_version(self, base + 1) if is_local(self._uri) else None
        try:
            committed = LanceDataset.commit(self._uri, transaction, commit_lock=commit_lock, max_retries=0,
                                            storage_options=self.storage_options or None)
        except (OSError, CommitConflictError) as exc:
            if self.dataset().version == base:
                raise LakeCommitConflictError(f"lake commit to {self._uri} (base {base}) refused: {exc}") from exc
            raise LakeCommitConflictError(
                f"lake commit to {self._uri} refused: another commit landed after version {base}"
            ) from exc
        if committed.version != base + 1:
            log.error("lake commit to %s landed as version %d over another commit since version %d (an object store "
                      "rebased it)", self._uri, committed.version, base)
        if self.layout.info.options.datalake_auto_expire_snapshot:
            with contextlib.suppress(OSError):  # a racing cleanup: the next round cleans up
                committed.cleanup_old_versions()
        return int(committed.version)

    def abort(self, results: Sequence[LakeWriteResult]) -> None:
        """Delete the fragment files of the results, except any the latest version references."""
        paths = [file["path"] for result in results
                 for fragment in json.loads(result.payload)["fragments"] for file in fragment["files"]]
        if not paths:
            return
        live = {file.path for fragment in self.dataset().get_fragments() for file in fragment.metadata.files}
        delete_data_files(self, [path for path in paths if path not in live])

    # ---- reading ----
    def last_strom_commit(self, after_snapshot_id: int | None) -> CommittedLakeSnapshot | None:
        dataset = self.dataset()
        for version in sorted((int(v["version"]) for v in dataset.versions()), reverse=True):
            if after_snapshot_id is not None and version <= after_snapshot_id:
                return None
            transaction = dataset.read_transaction(version)
            properties = dict(transaction.transaction_properties or {}) if transaction is not None else {}
            if properties.get(COMMIT_USER_PROPERTY) == COMMIT_USER:
                return CommittedLakeSnapshot(version, properties)
        return None

    def stats(self, snapshot_id: int | None = None) -> LakeStats:
        versions = {int(v["version"]): v["metadata"] for v in self.dataset().versions()}
        version = max(versions) if snapshot_id is None else snapshot_id
        if version not in versions:
            raise ValueError(f"no version {snapshot_id} in {self._uri}")
        metadata = versions[version]
        return LakeStats(int(metadata.get("total_files_size", 0)), int(metadata.get("total_rows", 0)))

    def _bucket_filter(self, bucket: int, partition_name: str | None) -> str:
        """Lance's SQL filter of one (partition, bucket); an Arrow expression would be translated through
        Substrait with the whole schema, which has no TIME type."""
        conditions = []
        for key, value in self.layout.partition_values(bucket, partition_name).items():
            column = "`" + key.replace("`", "``") + "`"
            arrow_type = self.layout.schema.field(key).type
            if pa.types.is_string(arrow_type):
                literal = "'" + value.replace("'", "''") + "'"
            elif pa.types.is_date(arrow_type):
                literal = f"CAST('{dt.date.fromisoformat(value).isoformat()}' AS DATE)"
            elif pa.types.is_boolean(arrow_type):
                literal = "true" if value == "true" else "false"
            else:
                literal = str(int(value))
            conditions.append(f"{column} = {literal}")
        return " AND ".join(conditions)

    def read_bucket(
        self,
        snapshot_id: int,
        bucket: int,
        partition_name: str | None,
        columns: Sequence[str] | None = None,
        with_system_columns: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        names = list(columns) if columns is not None else self.layout.row_type.field_names
        wanted = names + list(SYSTEM_COLUMNS) if with_system_columns else names
        scanner = self.dataset(snapshot_id).scanner(columns=wanted, filter=self._bucket_filter(bucket, partition_name))
        for batch in scanner.to_batches():
            if batch.num_rows:
                yield from self.layout.from_lake(batch, names, with_system_columns).to_batches()

    def buckets(self, snapshot_id: int) -> list[tuple[str | None, int]]:
        return self.layout.buckets_in(self.dataset(snapshot_id).to_table(columns=self.layout.partition_columns))

    def read(self, snapshot_id: int | None = None) -> pa.Table:
        return self.dataset(snapshot_id).to_table()


def _manifest_exists(uri: str, version: int) -> bool:
    """Whether a local dataset has version ``version``, by its manifest file (either of Lance's naming
    schemes: ``<version>.manifest`` or, in its v2 paths, ``<2^64 - 1 - version>.manifest`` zero-padded to 20
    digits). Lance's own calls cannot run inside its commit lock."""
    versions = os.path.join(uri, "_versions")
    return any(os.path.exists(os.path.join(versions, name))
               for name in (f"{version}.manifest", f"{(1 << 64) - 1 - version:020d}.manifest"))


def _only_version(table: LanceLakeTable, expected: int) -> Any:
    """A Lance commit lock that lets a commit write version ``expected`` only, while no one else writes
    one: Lance would rebase an append over another that landed first, which a round planned on the older
    version must not. With a custom lock Lance leaves mutual exclusion to it: the version's manifest is
    looked for under :func:`~strom.lake.commit_lock.exclusive`."""

    @contextlib.contextmanager
    def lock(version: int) -> Iterator[None]:
        if version != expected:
            raise CommitConflictError(f"the commit would write version {version}, its round was planned for {expected}")
        with exclusive(table.uri):
            if _manifest_exists(table.uri, version):
                raise CommitConflictError(f"version {version} landed first")
            yield

    return lock


def delete_data_files(table: LanceLakeTable, paths: Sequence[str]) -> None:
    """Delete fragment data files (named relative to the dataset's data directory)."""
    if not paths:
        return
    fs, root = filesystem(table.uri)
    for path in paths:
        with contextlib.suppress(FileNotFoundError, OSError):
            fs.delete_file(f"{root.rstrip('/')}/{_DATA_DIRECTORY}/{path}")


class LanceLakeWriter(LakeWriter):
    """Writes one (partition, bucket) split as Lance fragments: rows are buffered up to a row group's
    worth, then written as fragment files; nothing is visible until the driver commits them."""

    def __init__(self, table: LanceLakeTable, bucket: TableBucket, partition_name: str | None,
                 base_snapshot_id: int | None) -> None:
        table.layout.partition_values(bucket.bucket, partition_name)  # the partition name fits the table
        self.table = table
        self.bucket = bucket
        self.partition_name = partition_name
        self.base_snapshot_id = base_snapshot_id
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._fragments: list[dict[str, Any]] = []
        self._completed = False

    def append(self, rows: pa.RecordBatch, offsets: pa.Array, timestamps: pa.Array) -> None:
        if not rows.num_rows:
            return
        lake_rows = self.table.layout.to_lake(rows, self.bucket.bucket, offsets, timestamps)
        self._pending.append(lake_rows)
        self._pending_rows += lake_rows.num_rows
        self._pending_bytes += lake_rows.nbytes
        limits = self.table.limits
        if self._pending_rows >= limits.row_group_rows_max or self._pending_bytes >= limits.row_group_bytes_max:
            self._flush()

    def delete_keys(self, keys: pa.Table) -> None:
        raise InvalidTableError(f"table '{self.table.layout.info.path}' is a log table: Lance holds no keys to delete")

    def _flush(self) -> None:
        if not self._pending:
            return
        rows = pa.concat_tables(self._pending)
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        limits, sizes = self.table.limits, self.table.file_sizes
        fragments = write_fragments(
            rows, self.table.uri, schema=self.table.layout.schema,
            max_rows_per_file=sizes.get("max_rows_per_file", limits.file_rows_max),
            max_rows_per_group=sizes.get("max_rows_per_group"),
            max_bytes_per_file=sizes.get("max_bytes_per_file", limits.file_bytes_target),
            storage_options=self.table.storage_options or None,
        )
        self._fragments.extend(fragment.to_json() for fragment in fragments)

    def complete(self) -> LakeWriteResult:
        self._flush()
        self._completed = True
        files = [file for fragment in self._fragments for file in fragment["files"]]
        payload = json.dumps({"base": self.base_snapshot_id, "fragments": self._fragments}).encode()
        return LakeWriteResult(
            bucket=self.bucket, partition_name=self.partition_name, payload=payload,
            record_count=sum(int(fragment["physical_rows"]) for fragment in self._fragments),
            file_size=sum(int(file.get("file_size_bytes") or 0) for file in files), file_count=len(files),
        )

    def close(self) -> None:
        self._pending = []
        if not self._completed:
            delete_data_files(self.table, [file["path"] for fragment in self._fragments for file in fragment["files"]])
            self._fragments = []

