"""Writes into Delta and Iceberg tables: distributed data files, one commit by the table's library.

:class:`TableWrites` gives :class:`~distfusion.context.DistributedDataFrame`
its ``write_delta`` and ``write_iceberg``; :mod:`.files` runs the tasks and
places their files, :mod:`.delta` and :mod:`.iceberg` commit them. :class:`CatalogMounts` gives
:class:`~distfusion.context.DistributedContext` its ``register_catalog``
(:mod:`.catalogs`; a directory of Delta tables is a :class:`DeltaDirectoryCatalog`),
:class:`TableInserts` and :class:`TableMerges` its SQL ``INSERT`` and ``MERGE``.
"""

from __future__ import annotations

import os
from typing import Any

from distfusion.coordinator.hosts import FrameHost
from distfusion.table_write.catalogs import CatalogMounts
from distfusion.table_write.delta import TableCommit, write_delta
from distfusion.table_write.delta_catalog import DeltaDirectoryCatalog
from distfusion.table_write.files import TableWriteError
from distfusion.table_write.iceberg import write_iceberg
from distfusion.table_write.merge import TableMerges
from distfusion.table_write.sql import TableInserts

__all__ = [
    "CatalogMounts",
    "DeltaDirectoryCatalog",
    "TableCommit",
    "TableInserts",
    "TableMerges",
    "TableWriteError",
    "TableWrites",
]


class TableWrites(FrameHost):
    """The table writes of a :class:`~distfusion.context.DistributedDataFrame` (a mixin)."""

    def write_delta(
        self,
        table: str | os.PathLike | Any,
        mode: str = "append",
        partition_by: list[str] | str | None = None,
        predicate: str | None = None,
        schema_mode: str | None = None,
        storage_options: dict[str, str] | None = None,
        partition_overwrite_mode: str = "static",
    ) -> TableCommit:
        """Run the query and commit its rows into a Delta table, as one new version.

        Arguments as ``deltalake.write_deltalake`` (delta-rs 1.x) names them.
        Every head part writes one Parquet file (per partition) into the
        table's directory where it runs, as :meth:`write_parquet` does; then
        the coordinator reads the files' footers and commits one transaction
        through delta-rs (``DeltaTable.create_write_transaction``): an add
        action per file with its size, partition values and statistics
        (numRecords, min/max, nullCount), and for an overwrite the remove
        actions of the files replaced. A table that does not exist is created
        (version 0) by that commit. Nothing is visible before the commit; a
        failed or interrupted query, or a refused commit, deletes every file
        the write made. See :mod:`distfusion.table_write.delta`.

        Args:
            table: the table's root (a local path, or ``s3://``/``gs://``/
                ``az://`` URL) or a ``deltalake.DeltaTable``.
            mode: ``"append"``, or ``"overwrite"``: replace the table's rows
                (all of them; with ``predicate``, those it selects; with
                ``partition_overwrite_mode="dynamic"``, the partitions written).
            partition_by: partition columns of a new table (an existing
                table's must equal them when given).
            predicate: with ``"overwrite"``, SQL over the table's columns:
                the rows it selects are replaced, and every written row must
                match it. Over partition columns only, the files of the
                partitions it selects are removed; over data columns, the
                files that can hold such rows (narrowed by the predicate's
                conjuncts over partition columns and the files' min/max of
                integer and date columns) are rewritten without them
                in the same query and commit (the new rows are counted
                against the predicate first, so the query runs twice;
                :mod:`distfusion.table_write.delta_predicate`).
            schema_mode: ``None``: the result's columns must be the table's,
                of the same types; ``"merge"``: new columns are added to the
                table; ``"overwrite"`` (with ``mode="overwrite"``): the table
                takes the result's schema.
            storage_options: delta-rs's options for an object store table;
                default: made from the store registered for its bucket. A
                bucket without a store gets one made from them, for the tasks.
            partition_overwrite_mode: ``"static"``, or ``"dynamic"``: an
                overwrite replaces exactly the partitions the query writes
                (Spark's ``spark.sql.sources.partitionOverwriteMode``).

        Returns:
            The commit: the new version, the files added and removed, rows
            and bytes added.

        Raises:
            ImportError: deltalake is not installed.
            ValueError: an unknown ``mode``, ``schema_mode`` or
                ``partition_overwrite_mode``; a column missing, extra or of
                another type than the table's (the message names it);
                ``partition_by`` unlike the table's; a ``predicate`` that is
                not SQL over the table's columns, or rows written outside it.
                Raised before any data file is written, except rows outside a
                predicate over partition columns (after the tasks, before
                the commit).
            PlanningError: the table cannot be loaded; the query cannot be
                planned.
            TableWriteError: delta-rs refused the commit (a concurrent commit
                conflicts): names the table and the version the write read; a
                NULL reached a NOT NULL column (checked on the values while
                the tasks write; a nullable-typed column is accepted): names
                the table and the column.
            TaskError, TransportError, ContextClosedError: as
                :meth:`execute_stream`; nothing is committed.
        """
        return write_delta(
            self,
            table,
            mode,
            partition_by,
            predicate,
            schema_mode,
            storage_options,
            partition_overwrite_mode,
        )

    def write_iceberg(
        self, table: Any, mode: str = "append", overwrite_filter: Any = None
    ) -> TableCommit:
        """Run the query and commit its rows into an Iceberg table, in one catalog commit.

        Names and meanings as pyiceberg's ``Table.append`` / ``Table.overwrite``
        (pyiceberg 0.12). Every head part writes Parquet files (one per
        partition) below the table's data location where it runs, with the
        table's field ids and its partition transforms' directories; the
        coordinator makes a ``DataFile`` per file from its footer (value and
        null counts, column sizes, lower and upper bounds) and commits them
        with pyiceberg's snapshot producers in one transaction: a
        ``fast_append`` (append), or an ``overwrite`` snapshot deleting every
        current data file (full overwrite); with ``overwrite_filter``,
        pyiceberg's ``delete(overwrite_filter)`` then the fast append, as
        pyiceberg's own ``overwrite`` (two snapshots, one commit). Why these
        and not ``add_files``: see :mod:`distfusion.table_write.iceberg`.
        Nothing is visible before the commit; a failed or interrupted query,
        or a refused commit, deletes every file the write made. A blind
        append that loses a race to another commit is committed again.

        Args:
            table: a pyiceberg ``Table``, from any catalog; it is refreshed
                by the commit.
            mode: ``"append"`` or ``"overwrite"``.
            overwrite_filter: with ``"overwrite"``, the rows to replace, as
                pyiceberg takes it (a ``BooleanExpression`` or its string
                form); default: every row.

        Returns:
            The commit: the new snapshot id, files added and removed, rows
            and bytes added.

        Raises:
            TypeError: ``table`` is not a pyiceberg ``Table``.
            ValueError: an unknown ``mode``; ``overwrite_filter`` without
                ``"overwrite"``; a column not in the table, a required one
                missing, a type that does not fit (named); a bucket or void
                partition transform (not computed yet). Raised before any task.
            TableWriteError: the catalog refused the commit (a concurrent
                commit other than a blind append's race): names the table and
                both snapshot ids; a NULL reached a required column (checked
                on the values while the tasks write; a nullable-typed column
                is accepted): names the table and the column.
            PlanningError, TaskError, TransportError, ContextClosedError: as
                :meth:`execute_stream`; nothing is committed.
        """
        return write_iceberg(self, table, mode, overwrite_filter)
