"""``INSERT INTO`` / ``INSERT OVERWRITE`` a registered Delta or Iceberg table, in SQL.

:class:`TableInserts` is the part of :class:`~distfusion.context.DistributedContext`
that :meth:`~distfusion.context.DistributedContext.sql` asks first for each
statement (``_insert_into_table``). A statement::

    INSERT INTO t [(c1, c2, ...)] query
    INSERT OVERWRITE [TABLE] t [(c1, c2, ...)] query

whose ``t`` is a table registered with ``register_delta`` or
``register_iceberg`` runs at once, distributed, as
:meth:`~distfusion.context.DistributedDataFrame.write_delta` /
:meth:`~distfusion.context.DistributedDataFrame.write_iceberg` with mode
``"append"`` / ``"overwrite"`` (the way ``CREATE TABLE ... AS`` runs when
planned). As in SQL, the query's columns go to the table's by position (or to
the listed columns; the others are NULL), cast to the table's types. The
statement's result is DataFusion's for an INSERT: one row, column ``count``
(UInt64), the rows written. The table is registered again afterwards, at
its new version, so later statements read what was written.

Any other statement (or an INSERT into another table) is left to the
caller (``None``).
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from distfusion.coordinator.hosts import ContextHost
from distfusion.coordinator.statements import table_name
from distfusion.errors import PlanningError
from distfusion.io import delta, object_store
from distfusion.io.iceberg import IcebergTable
from distfusion.io.sources import sql_name

__all__ = ["TableInserts", "parse_insert"]

_INSERT = re.compile(
    r"""^\s*INSERT\s+(INTO|OVERWRITE)\s+(?:TABLE\s+)?
        ("(?:[^"]|"")+"|[A-Za-z_][\w$]*)\s*
        (?:\(\s*([^()]*?)\s*\)\s*)?
        ((?:SELECT|WITH|VALUES|\()[\s\S]*)$""",
    re.IGNORECASE | re.VERBOSE,
)


def parse_insert(sql: str) -> tuple[str, str, list[str] | None, str] | None:
    """``(mode, table, columns, query)`` of an ``INSERT INTO|OVERWRITE t [(cols)] query``.

    ``mode`` is ``"append"`` or ``"overwrite"``; ``table`` as written (quotes
    kept); ``columns`` None without a list. None for any other statement.

    Example:
        >>> parse_insert("INSERT OVERWRITE t (a, b) SELECT 1, 2")
        ('overwrite', 't', ['a', 'b'], 'SELECT 1, 2')
    """
    m = _INSERT.match(sql)
    if m is None:
        return None
    kind, table, cols, query = m.groups()
    columns = None
    if cols is not None:
        columns = [_unquote(c.strip()) for c in cols.split(",") if c.strip()]
    return ("append" if kind.upper() == "INTO" else "overwrite"), table, columns, query


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name.lower()


class TableInserts(ContextHost):
    """INSERT into the Delta and Iceberg tables of a DistributedContext (a mixin).

    Uses the context's ``sources``, ``_feed_sources``, ``sql``, ``ctx``,
    ``register_delta`` and ``register_iceberg``.
    """

    def _insert_into_table(self, sql: str) -> Any:
        """Run ``sql`` when it INSERTs into a Delta or Iceberg table; its result, else None.

        Raises:
            PlanningError: the query's columns do not match the table's in
                number, or a listed column is not the table's.
            ValueError, TableWriteError, TaskError: as ``write_delta`` /
                ``write_iceberg``.
        """
        parsed = parse_insert(sql)
        if parsed is None:
            return None
        mode, written, columns, query = parsed
        name = table_name(written)
        source = self.sources.get(name)
        if source is None:
            return None
        feed = self._feed_sources.get(name)
        if isinstance(feed, IcebergTable):
            from pyiceberg.io.pyarrow import schema_to_pyarrow

            table = feed.table
            target = schema_to_pyarrow(table.schema(), include_field_ids=False)
            frame = self._insert_frame(name, query, target, columns)
            commit = frame.write_iceberg(table, mode=mode)
            self.register_iceberg(sql_name(name), table)
        elif source.options.get("delta_table"):
            from deltalake import DeltaTable

            uri = source.options["delta_table"]
            dt = DeltaTable(uri, storage_options=_options(uri))
            target = pa.schema(dt.schema().to_arrow())
            frame = self._insert_frame(name, query, target, columns)
            commit = frame.write_delta(dt, mode=mode)
            self.register_delta(sql_name(name), uri)
        else:
            return None
        return self.ctx.from_arrow(pa.table({"count": pa.array([commit.rows], pa.uint64())}))

    def _insert_frame(
        self, name: str, query: str, target: pa.Schema, columns: list[str] | None
    ) -> Any:
        """``query``'s frame with the table's columns: by position, cast; unlisted ones NULL."""
        frame = self.sql(query)
        got = frame.schema().names
        names = columns if columns is not None else target.names
        unknown = [c for c in names if c not in target.names]
        if unknown:
            msg = f"INSERT INTO {name}: {unknown} are not columns of it ({', '.join(target.names)})"
            raise PlanningError(msg)
        if len(got) != len(names):
            msg = (
                f"INSERT INTO {name}: the query gives {len(got)} column(s), "
                f"the insert takes {len(names)} ({', '.join(names)})"
            )
            raise PlanningError(msg)
        by_target = dict(zip(names, got, strict=True))
        exprs = []
        for f in target:
            if f.name in by_target:
                exprs.append(f"{_ident(by_target[f.name])} AS {_ident(f.name)}")
            else:
                exprs.append(f"NULL AS {_ident(f.name)}")
        frame = frame.select_exprs(*exprs)
        have = frame.schema()
        casts = {f.name: f.type for f in target if have.field(f.name).type != f.type}
        return frame.cast(casts) if casts else frame


def _ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _options(uri: str) -> dict | None:
    return delta.storage_options_for(uri) if object_store.is_url(uri) else None
