"""``MERGE INTO`` a registered Delta or Iceberg table, copy-on-write: one query, one commit.

:meth:`~distfusion.context.DistributedContext.sql` asks :class:`TableMerges`
(``_merge_into_table``) first for each statement. A statement (parsed with
sqlglot)::

    MERGE INTO t [AS a] USING s [AS b] ON cond
      WHEN MATCHED [AND c] THEN UPDATE SET col = expr, ... | UPDATE SET * | DELETE
      WHEN NOT MATCHED [BY TARGET] [AND c] THEN INSERT (cols) VALUES (exprs) | INSERT *
      WHEN NOT MATCHED BY SOURCE [AND c] THEN UPDATE SET col = expr, ... | DELETE

whose ``t`` is a table registered with ``register_delta`` or
``register_iceberg`` (or a mounted catalog's ``lake.db.t``) runs at once,
distributed, with Spark's and delta-rs's semantics: the first ``WHEN``
clause whose condition holds applies to a row; a matched target row no
clause applies to stays as it is; a source row no ``NOT MATCHED`` clause
applies to is dropped; a target row no source row matches takes the first
``NOT MATCHED BY SOURCE`` clause that holds (Spark 3.4's and Delta's), else
stays as it is; a target row matched by two source rows (with a
``WHEN MATCHED`` clause) is an error, before anything is written. One
distributed query computes the table's new rows::

    (target, TRUE AS __df_t) FULL OUTER JOIN (source, TRUE AS __df_s) ON cond
      -> per row the clause that applies (CASE, in the clauses' order)
      -> per column its new value; rows deleted or not inserted dropped

and :func:`~distfusion.table_write.delta.write_delta` commits them as an
overwrite of the version the merge read: one new version (add actions of the
new files, remove actions of every old one), with delta-rs's conflict check
against any commit in between. An Iceberg table's rows are committed by
:func:`~distfusion.table_write.iceberg.write_iceberg` as one ``overwrite``
snapshot on the snapshot the merge read, deleting the data files read
(:mod:`distfusion.table_write.iceberg_merge`).

Copy-on-write of the files that can match: when ON holds equalities
``tgt.c = <source expression>``, the source's range of each (min and max, one
more query over the source) selects the target files whose partition values
or min/max (integer and date columns) overlap it
(:func:`~distfusion.table_write.delta.merge_candidates`; for Iceberg,
pyiceberg's pruning by partition values and column bounds:
:func:`~distfusion.table_write.iceberg_merge.merge_files`); only they are read,
joined and rewritten, and the commit removes only them. Without such keys,
every file is rewritten, and so it is with a ``WHEN NOT MATCHED BY SOURCE``
clause (it applies to target rows of any file). The statement's result is one
row, column ``count``: the
rows of the new version (the untouched files' counted from the log).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from distfusion.coordinator.ddl import fold_identifier, sql_tokens
from distfusion.coordinator.hosts import ContextHost
from distfusion.coordinator.statements import table_name
from distfusion.errors import PlanningError
from distfusion.io import delta, object_store
from distfusion.io.iceberg import IcebergTable
from distfusion.io.iceberg.table import arrow_schema
from distfusion.io.sources import sql_name
from distfusion.table_write.delta import merge_candidates, write_delta
from distfusion.table_write.iceberg import write_iceberg
from distfusion.table_write.iceberg_merge import MergeTargetFiles, merge_files

if TYPE_CHECKING:
    from distfusion.table_write.catalogs import MountedCatalogs

__all__ = ["MergeClause", "TableMerges", "parse_merge"]

_MERGE = re.compile(r"^\s*MERGE\s+INTO\b", re.IGNORECASE)
T, S = '"__df_t"', '"__df_s"'


@dataclass
class MergeClause:
    """One ``WHEN`` clause: matched or not, its condition (SQL or None), its action.

    ``action``: ``"update"``, ``"delete"`` or ``"insert"``; ``values``: target
    column -> SQL expression (``None``: ``SET *`` / ``INSERT *``, by name).
    ``by_source``: a ``WHEN NOT MATCHED BY SOURCE`` clause (``matched`` is
    False; it applies to target rows no source row matches).
    """

    matched: bool
    condition: str | None
    action: str
    values: dict[str, str] | None = field(default=None)
    by_source: bool = False


@dataclass
class MergeStatement:
    """A parsed ``MERGE INTO``."""

    target: str
    target_alias: str
    source: str  # a table name or "(query)"
    source_alias: str
    on: str
    clauses: list[MergeClause]


def parse_merge(sql: str) -> MergeStatement | None:
    """The parts of a ``MERGE INTO`` statement; None for any other statement.

    Raises:
        PlanningError: a MERGE sqlglot cannot parse, or a clause not listed
            in the module docstring (``UPDATE SET *`` of ``NOT MATCHED BY
            SOURCE``: there is no source row).
    """
    if not _MERGE.match(sql):
        return None
    try:
        tree = sqlglot.parse_one(_backquoted(sql), read="spark")
    except sqlglot.errors.ParseError as exc:
        msg = f"cannot parse the MERGE statement: {exc}"
        raise PlanningError(msg) from None
    if not isinstance(tree, exp.Merge):
        return None

    def render(e: Any) -> str:
        return e.sql(dialect="postgres")

    target = tree.this
    using = tree.args["using"]
    source_alias = using.alias_or_name
    if isinstance(using, exp.Table):
        source = render(using.this)
    else:
        source = f"({render(using.this)})"
    clauses = []
    whens = tree.args.get("whens")
    for when in whens.expressions if whens is not None else []:
        by_source = bool(when.args.get("source"))
        cond = when.args.get("condition")
        then = when.args["then"]
        matched = bool(when.args.get("matched"))
        condition = render(cond) if cond is not None else None
        # a target row's clauses: WHEN MATCHED, or WHEN NOT MATCHED BY SOURCE
        of_target = matched or by_source
        if isinstance(then, exp.Var) and then.name.upper() == "DELETE" and of_target:
            clauses.append(MergeClause(matched, condition, "delete", by_source=by_source))
        elif isinstance(then, exp.Update) and of_target:
            values = None
            if not (len(then.expressions) == 1 and isinstance(then.expressions[0], exp.Star)):
                values = {e.this.name: render(e.expression) for e in then.expressions}
            elif by_source:
                msg = "MERGE: WHEN NOT MATCHED BY SOURCE cannot UPDATE SET * (no source row)"
                raise PlanningError(msg)
            clauses.append(MergeClause(matched, condition, "update", values, by_source))
        elif isinstance(then, exp.Insert) and not matched:
            values = None
            if not isinstance(then.this, exp.Star):
                cols = [c.name for c in then.this.expressions]
                exprs = [render(v) for v in then.expression.expressions]
                values = dict(zip(cols, exprs, strict=True))
            clauses.append(MergeClause(False, condition, "insert", values))
        else:
            msg = f"MERGE: clause {render(when)!r} is not supported"
            raise PlanningError(msg)
    return MergeStatement(
        render(target.this),
        target.alias_or_name,
        source,
        source_alias,
        render(tree.args["on"]),
        clauses,
    )


def _backquoted(sql: str) -> str:
    r"""``sql`` with its double-quoted identifiers in backquotes, as Spark's parser takes them.

    DataFusion's SQL quotes identifiers with ``"`` (a catalog table's rewritten
    name too: ``"lake.db.t"``, ``"t".id``); Spark's dialect reads ``"t"`` as a string.

    Example:
        >>> print(_backquoted("MERGE INTO \"T\" USING s ON \"T\".id = s.id AND s.c = '\"x\"'"))
        MERGE INTO `T` USING s ON `T`.id = s.id AND s.c = '"x"'
    """
    try:
        tokens = sql_tokens(sql)
    except TokenError:
        return sql
    out, at = [], 0
    for t in tokens:
        if t.token_type == TokenType.IDENTIFIER:
            out += [sql[at : t.start], "`" + t.text.replace("`", "``") + "`"]
            at = t.end + 1
    return "".join([*out, sql[at:]])


def _names(sql: str, table: str) -> bool:
    """Whether ``sql`` holds the identifier ``table`` (folded as DataFusion does), or cannot be cut.

    Example:
        >>> _names('(SELECT id + 1 AS id FROM "lake.db.t" AS t)', "lake.db.t")
        True
    """
    try:
        tokens = sql_tokens(sql)
    except TokenError:
        return True
    return any(
        fold_identifier(t.text, t.token_type == TokenType.IDENTIFIER) == table
        for t in tokens
        if t.token_type in (TokenType.VAR, TokenType.IDENTIFIER)
    )


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def merge_sql(m: MergeStatement, columns: list[str], source_columns: list[str]) -> str:
    """The query giving the target's rows after ``m`` (see the module docstring)."""
    ta, sa = _ident(m.target_alias), _ident(m.source_alias)
    matched = f"({ta}.{T} IS NOT NULL AND {sa}.{S} IS NOT NULL)"
    target_only = f"({sa}.{S} IS NULL)"
    source_only = f"({ta}.{T} IS NULL)"
    matched_cases, target_cases, source_cases = [], [], []
    for i, c in enumerate(m.clauses, 1):
        cond = f" AND ({c.condition}) IS TRUE" if c.condition else ""
        if c.matched:
            matched_cases.append(f"WHEN {matched}{cond} THEN {i}")
        elif c.by_source:
            target_cases.append(f"WHEN {target_only}{cond} THEN {i}")
        else:
            source_cases.append(f"WHEN {source_only}{cond} THEN {i}")
    # the first clause that holds applies (Spark's order); a matched row none applies to,
    # and a target row no source row matches none applies to, stay as they are (0)
    which = " ".join(
        [
            "CASE",
            *matched_cases,
            *target_cases,
            f"WHEN {matched} OR {target_only} THEN 0",
            *source_cases,
        ]
    )
    which += " ELSE -1 END"
    outs = []
    for col in columns:
        arms = [f"WHEN 0 THEN {ta}.{_ident(col)}"]
        for i, c in enumerate(m.clauses, 1):
            if c.action == "delete":
                continue
            if c.values is None:  # SET * / INSERT *: the source's column of that name
                if col not in source_columns:
                    msg = f"MERGE: {c.action.upper()} * needs column {col!r} in the source"
                    raise PlanningError(msg)
                value = f"{sa}.{_ident(col)}"
            elif col in c.values:
                value = c.values[col]
            else:
                value = f"{ta}.{_ident(col)}" if c.action == "update" else "NULL"
            arms.append(f"WHEN {i} THEN {value}")
        outs.append(f"CASE ({which}) {' '.join(arms)} END AS {_ident(col)}")
    deleted = [str(i) for i, c in enumerate(m.clauses, 1) if c.action == "delete"]
    keep = f"({which}) >= 0"
    if deleted:
        keep += f" AND ({which}) NOT IN ({', '.join(deleted)})"
    return (
        f"SELECT {', '.join(outs)} "
        f"FROM (SELECT *, TRUE AS {T} FROM {m.target}) AS {ta} "
        f"FULL OUTER JOIN (SELECT *, TRUE AS {S} FROM {m.source} AS {sa}) AS {sa} "
        f"ON {m.on} WHERE {keep}"
    )


def duplicate_match_sql(m: MergeStatement) -> str:
    """A query giving a row when some target row is matched by two or more source rows."""
    ta, sa = _ident(m.target_alias), _ident(m.source_alias)
    return (
        f"SELECT 1 AS dup FROM (SELECT *, row_number() OVER () AS __df_rid FROM {m.target}) "
        f"AS {ta} JOIN (SELECT * FROM {m.source} AS {sa}) AS {sa} ON {m.on} "
        "GROUP BY __df_rid HAVING count(*) > 1 LIMIT 1"
    )


class TableMerges(ContextHost):
    """MERGE INTO the Delta and Iceberg tables of a DistributedContext (a mixin).

    Uses the context's ``sources``, ``_feed_sources``, ``sql``, ``ctx``,
    ``register_delta``, ``register_iceberg``, ``register_feed_table`` and
    ``_mounted`` (:class:`~distfusion.table_write.catalogs.CatalogMounts`'
    loaded catalog tables).
    """

    if TYPE_CHECKING:

        @property
        def _mounted(self) -> MountedCatalogs: ...  # CatalogMounts'

    def _merge_into_table(self, sql: str) -> Any:
        """Run ``sql`` when it is a MERGE INTO a Delta or Iceberg table; its result, else None.

        Raises:
            PlanningError: see :func:`parse_merge`; the target is registered
                but neither a Delta nor an Iceberg table; a source row matches
                two target rows (a target row is matched twice), raised
                before any write.
            ValueError, TableWriteError, TaskError: as ``write_delta`` /
                ``write_iceberg``.
        """
        m = parse_merge(sql)
        if m is None:
            return None
        name = table_name(m.target)
        source = self.sources.get(name)
        if source is None:
            return None
        if m.target_alias == name and "." in name and name in self._mounted.loaded:
            m.target_alias = name.rsplit(".", 1)[1]  # lake.db.t.c was rewritten as "t".c
        feed = self._feed_sources.get(name)
        if isinstance(feed, IcebergTable):
            rows = self._merge_into_iceberg(m, name, feed.table)
        elif source.options.get("delta_table"):
            rows = self._merge_into_delta(m, name, source.options["delta_table"])
        else:
            msg = (
                f"MERGE INTO {name}: only Delta and Iceberg tables (register_delta, "
                "register_iceberg, a mounted catalog's) take MERGE here"
            )
            raise PlanningError(msg)
        return self.ctx.from_arrow(pa.table({"count": pa.array([rows], pa.uint64())}))

    def _merge_into_delta(self, m: MergeStatement, name: str, uri: str) -> int:
        """MERGE into the Delta table at ``uri``; the rows of its new version."""
        from deltalake import DeltaTable

        options = delta.storage_options_for(uri) if object_store.is_url(uri) else None
        dt = DeltaTable(uri, storage_options=options)
        self.register_delta(sql_name(name), dt)  # the version the merge reads and commits over
        target = pa.schema(dt.schema().to_arrow())
        replacing, untouched_rows = self._merge_pruned(m, name, uri, dt, target)
        try:
            frame = self._merged_rows(m, name, target)
            commit = write_delta(frame, dt, "overwrite", replacing=replacing)
        except BaseException:
            if replacing is not None:  # the whole table again, not only the files read
                self.register_delta(sql_name(name), dt)
            raise
        self.register_delta(sql_name(name), uri)
        return commit.rows + untouched_rows

    def _merge_into_iceberg(self, m: MergeStatement, name: str, table: Any) -> int:
        """MERGE into the pyiceberg ``table``; the rows of its new snapshot.

        See :mod:`distfusion.table_write.iceberg_merge`.

        Raises:
            PlanningError: the table cannot be refreshed (a ``StaticTable``).
        """
        try:
            table.refresh()  # the snapshot the merge reads and commits over
        except Exception as exc:
            msg = f"MERGE INTO {name}: cannot refresh the Iceberg table ({exc}); is it writable?"
            raise PlanningError(object_store.redact(msg)) from exc
        target = arrow_schema(name, table.schema())  # as the target is read
        files = merge_files(table, self._merge_key_ranges(m, target.names))
        self.register_feed_table(sql_name(name), MergeTargetFiles(table, files, name=name))
        try:
            frame = self._merged_rows(m, name, target)
            commit = write_iceberg(frame, table, "overwrite", replacing=files.replaced)
        finally:  # the whole table again (at its new snapshot when committed)
            self.register_iceberg(sql_name(name), table)
        return commit.rows + files.untouched_rows

    def _merged_rows(self, m: MergeStatement, name: str, target: pa.Schema) -> Any:
        """The frame of the target's rows after ``m``, with ``target``'s columns and types.

        Raises:
            PlanningError: a target row is matched by two source rows (checked
                by a query, before anything is written).
        """
        source_columns = self.sql(f"SELECT * FROM {m.source} AS {_ident(m.source_alias)}")
        source_names = source_columns.schema().names
        if any(c.matched for c in m.clauses) and self.sql(duplicate_match_sql(m)).to_pylist():
            msg = (
                f"MERGE INTO {name}: a target row is matched by more than one source row "
                "(Spark's and delta-rs's error); make the source unique on the ON keys"
            )
            raise PlanningError(msg)
        frame = self.sql(merge_sql(m, target.names, source_names))
        have = frame.schema()
        casts = {f.name: f.type for f in target if have.field(f.name).type != f.type}
        return frame.cast(casts) if casts else frame

    def _merge_key_ranges(
        self, m: MergeStatement, columns: list[str]
    ) -> list[tuple[str, Any, Any]] | None:
        """``(target column, min, max)`` over the source of each ON key (:func:`merge_keys`).

        One query over the source. ``min`` and ``max`` are None when no
        source row has the key (no target row can match). None when ON has no
        key, or the source names the target table (it must read all of it,
        while the merge registers the target as the files it rewrites), or a
        ``WHEN NOT MATCHED BY SOURCE`` clause applies to the rows of every file.
        """
        keys = merge_keys(m, columns)
        if any(c.by_source for c in m.clauses):  # its clauses apply to rows of every file
            return None
        if not keys or _names(m.source, table_name(m.target)):
            return None
        sa = _ident(m.source_alias)
        exprs = [f"min({e}) AS lo{i}, max({e}) AS hi{i}" for i, (_, e) in enumerate(keys)]
        bounds = self.sql(f"SELECT {', '.join(exprs)} FROM {m.source} AS {sa}").to_pylist()[0]
        return [(c, bounds[f"lo{i}"], bounds[f"hi{i}"]) for i, (c, _) in enumerate(keys)]

    def _merge_pruned(
        self, m: MergeStatement, name: str, uri: str, dt: Any, target: pa.Schema
    ) -> tuple[list[dict] | None, int]:
        """Register only the Delta files the source's ON keys can match; ``(those, rows kept)``.

        ``(None, 0)`` (every file rewritten) when the ON condition has no
        equality of a target column with the source's, the keys' range
        (min/max over the source, a query) prunes no file, or a key's type
        has no usable bounds.
        """
        ranges = self._merge_key_ranges(m, target.names)
        if not ranges:
            return None, 0
        conditions = []
        for column, lo_value, hi_value in ranges:
            if lo_value is None:  # no source row has a key: none matches
                conditions = ["FALSE"]
                break
            lo, hi = _literal(lo_value), _literal(hi_value)
            if lo is not None and hi is not None:
                conditions.append(f"{_ident(column)} BETWEEN {lo} AND {hi}")
        if not conditions:
            return None, 0
        files, keep, total = merge_candidates(uri, dt, " AND ".join(conditions))
        if len(files) == total:
            return None, 0
        self._register_delta_files(sql_name(name), dt, keep)  # what the merge query reads
        actions = pa.table(dt.get_add_actions(flatten=True))
        records = actions["num_records"].to_pylist()
        return files, sum(n or 0 for i, n in enumerate(records) if i not in keep)


def merge_keys(m: MergeStatement, columns: list[str]) -> list[tuple[str, str]]:
    """``(target column, source expression)`` of each ``tgt.c = <source expr>`` conjunct of ON.

    Example:
        >>> m = MergeStatement("t", "t", "s", "s", "t.id = s.id + 1 AND t.x > s.x", [])
        >>> merge_keys(m, ["id", "x"])
        [('id', 's.id + 1')]
    """
    try:
        tree = sqlglot.parse_one(m.on, read="postgres")
    except sqlglot.errors.ParseError:
        return []
    conjuncts = list(tree.flatten()) if isinstance(tree, exp.And) else [tree]
    out = []
    for c in conjuncts:
        if not isinstance(c, exp.EQ):
            continue
        for a, b in ((c.left, c.right), (c.right, c.left)):
            refs = list(b.find_all(exp.Column))
            if (
                isinstance(a, exp.Column)
                and a.table.lower() == m.target_alias.lower()
                and a.name in columns
                and refs
                and all(r.table.lower() == m.source_alias.lower() for r in refs)
            ):
                out.append((a.name, b.sql(dialect="postgres")))
                break
    return out


def _literal(value: Any) -> str | None:
    """``value`` as a SQL literal for a bound (integers, dates, strings); None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime.datetime):
        return None
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return None
