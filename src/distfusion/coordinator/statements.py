"""Statements: SQL text split into statements, DDL and DML routed, writes told apart.

:func:`split_statements` cuts text on the semicolons between statements (with
sqlglot's PostgreSQL tokenizer); :func:`plan_statements` plans them in order
on a DataFusion context. :class:`StatementRouting` is the part of
:class:`~distfusion.context.DistributedContext` that plans one statement and
keeps its sources in step with what the statement did (``CREATE TABLE ... AS``
run distributed, memory tables read again after a write, external Parquet
tables as file sources). :mod:`distfusion.coordinator.ddl` reads a statement's tokens.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pyarrow as pa
from datafusion import DataFrame, SessionContext
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

from distfusion.coordinator.ddl import Statement, fold_identifier, parse_statement, sql_tokens
from distfusion.coordinator.hosts import ContextHost
from distfusion.errors import PlanningError
from distfusion.io.sources import memory_source, parquet_source, sql_name


def split_statements(sql: str) -> list[str]:
    r"""Split SQL text into its statements, on the semicolons between them.

    The text is tokenized with sqlglot's PostgreSQL tokenizer (DataFusion's SQL
    lexes as PostgreSQL's: ``'it''s'``, ``E'a\'b'``, ``$$...$$`` and
    ``$tag$...$tag$`` strings, ``"quoted"`` identifiers, ``--`` and nested
    ``/* */`` comments), so a ``;`` inside any of them does not split.

    Returns:
        One string per statement, in order: the original text from its first
        token to its last (comments before and after it dropped, those inside
        kept), without the ``;``. Statements with no token (empty, or only
        comments) are dropped. Text the tokenizer rejects (an unterminated string
        or comment) is returned whole as one statement, so that DataFusion
        reports the error in its own words.

    Example:
        >>> split_statements("SELECT 1 /* ; */ ; SELECT 'a;b' -- c;")
        ['SELECT 1', "SELECT 'a;b'"]
    """
    try:
        tokens = sql_tokens(sql)
    except TokenError:
        return [sql.strip()] if sql.strip() else []
    out: list[str] = []
    first = last = None
    for tok in [*tokens, None]:
        if tok is None or tok.token_type == TokenType.SEMICOLON:
            if first is not None and last is not None:  # set together
                out.append(sql[first.start : last.end + 1])
            first = last = None
        else:
            first = first or tok
            last = tok
    return out


_WRITES = ("DmlStatement", "CopyTo")
"""Logical plan variants that write (INSERT, UPDATE, DELETE, COPY): DataFusion
runs them when their DataFrame is collected, not when planned."""


def writes(df: DataFrame) -> bool:
    """Whether ``df`` is an INSERT, UPDATE, DELETE or COPY (it writes when collected)."""
    return type(df.logical_plan().to_variant()).__name__ in _WRITES


def plan_statements(
    ctx: SessionContext, sql: str, run: Callable[[str], DataFrame] | None = None
) -> DataFrame:
    """Plan the statements of ``sql`` on a DataFusion context, in order.

    DDL (``CREATE TABLE``, ``CREATE VIEW``, ``DROP TABLE``, ...) takes effect as
    it is planned. A write (``INSERT``, ``COPY``) before the last statement runs
    at once, so later statements see it (DataFusion runs a write only when its
    DataFrame is collected: the last statement's stays for the caller to run).
    The result is the last statement that returns columns (its plan keeps the
    definition of any view a later statement drops), else the last statement.
    Used by :meth:`DistributedContext.sql`, and for single-node DataFusion by the
    benchmark and the tests.

    Args:
        ctx: the context the statements run on.
        sql: one or more statements separated by ``;``.
        run: plans one statement (default ``ctx.sql``).

    Raises:
        PlanningError: ``sql`` holds no statement.
        Exception: DataFusion's error for an invalid statement.
    """
    statements = split_statements(sql)
    if not statements:
        raise PlanningError("no SQL statement given")
    run = run or ctx.sql
    result = None
    for i, stmt in enumerate(statements):
        df = run(stmt)
        if i < len(statements) - 1 and writes(df):
            df.collect()
        if result is None or len(df.schema()) > 0:
            result = df
    assert result is not None  # statements is not empty (checked above)
    return result


def table_name(name: str) -> str:
    """The name DataFusion registers a table under: ``T1`` is ``t1``, ``'"T1"'`` is ``T1``.

    DataFusion parses a name given to ``register_*`` as SQL does an identifier:
    unquoted, it folds to lower case; double-quoted, it keeps its case.
    """
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return fold_identifier(name, quoted=False)


class StatementRouting(ContextHost):
    """The statements of a :class:`~distfusion.context.DistributedContext` (a mixin).

    It plans one statement on the context's DataFusion ``ctx`` and keeps
    ``sources`` in step (``_add``, ``_stores_for``, ``_file_views``,
    ``_written``, ``sql``, ``_catalog_statement``, ``_insert_into_table`` and
    ``_merge_into_table`` are the context's).
    """

    def _statement(self, sql: str) -> DataFrame:
        """Plan one statement on the coordinator's context; keep :attr:`sources` in step."""
        self._reread_memory_tables()
        handled, sql = self._catalog_statement(sql)  # lake.db.t: distfusion.table_write.catalogs
        if handled is not None:
            return handled
        inserted = self._insert_into_table(sql)  # into Delta or Iceberg: distfusion.table_write
        if inserted is None:
            inserted = self._merge_into_table(sql)
        if inserted is not None:
            return inserted
        st = parse_statement(sql)
        if st.schema_qualified:  # another schema: DataFusion's alone (no source)
            return self.ctx.sql(sql)
        source = self.sources.get(st.table)
        if st.kind == "external" and st.location:
            self._stores_for(st.location)
        if st.kind == "dml" and source is not None and source.format != "memory":
            msg = (
                f"cannot write into table {st.table!r}: it is read from {source.format} files; "
                "INSERT INTO takes memory tables (CREATE TABLE, register_table, "
                "register_record_batches)"
            )
            raise PlanningError(msg)
        if st.kind == "ctas" and (
            not self.ctx.table_exist(sql_name(st.table)) or "REPLACE" in st.head.upper().split()
        ):
            df = self._create_table_as(st.head, st.query)
        else:
            df = self.ctx.sql(sql)
        self._sync_sources(st)
        return df

    def _create_table_as(self, head: str, query: str) -> DataFrame:
        """``{head} AS {query}`` with ``query`` run distributed; DataFusion creates the table."""
        result = self.sql(query).to_arrow_table()
        tmp = f"__distfusion_ctas_{uuid.uuid4().hex}"
        batches = result.to_batches() or [pa.RecordBatch.from_pylist([], schema=result.schema)]
        self.ctx.register_record_batches(tmp, [batches])
        try:
            return self.ctx.sql(f"{head}AS SELECT * FROM {tmp}")
        finally:
            self.ctx.deregister_table(tmp)

    def _sync_sources(self, st: Statement) -> None:
        """Sources after statement ``st``: dropped with their table, added for SQL-made tables."""
        schema = self.ctx.catalog().schema()
        names = set(schema.names())
        for name in list(self.sources):
            if name not in names or (
                schema.table(name).kind == "view"
                and (name not in self._file_views or (st.kind == "view" and st.table == name))
            ):
                del self.sources[name]
                self._file_views.discard(name)
        if st.table not in names or schema.table(st.table).kind == "view":
            return
        if st.kind in ("ctas", "create"):
            self._memory_source(st.table)
        elif st.kind == "external":
            self.sources.pop(st.table, None)  # replaced, or read on the coordinator
            if (
                st.stored_as == "PARQUET"
                and st.location
                and (st.partition_cols or not st.partitioned)
            ):
                try:
                    source = parquet_source(
                        st.table,
                        st.location,
                        self.ctx.table(sql_name(st.table)).schema(),
                        st.partition_cols,
                    )
                except PlanningError:  # remote or no local file: DataFusion reads it
                    return
                self._add(source)
        elif st.kind == "dml":
            self._written = True  # runs when collected: read memory tables again then

    def _memory_source(self, name: str) -> None:
        """(Re)describe memory table ``name`` from its batches in the coordinator's context."""
        table = self.ctx.table(sql_name(name))
        batches = [b for b in table.collect() if b.num_rows]
        if not batches:
            batches = [pa.RecordBatch.from_pylist([], schema=table.schema())]
        self._add(memory_source(name, [batches]))

    def _reread_memory_tables(self) -> None:
        """After a write may have run (INSERT ...), describe every memory table again."""
        if not self._written:
            return
        self._written = False
        for name, source in list(self.sources.items()):
            if source.format == "memory" and self.ctx.table_exist(sql_name(name)):
                self._memory_source(name)
