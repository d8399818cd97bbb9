"""Mounted catalogs: ``lake.db.orders`` in SQL, loaded when a statement names it.

:class:`CatalogMounts` is the part of :class:`~distfusion.context.DistributedContext`
that :meth:`~distfusion.context.DistributedContext.sql` asks first for each
statement (``_catalog_statement``)::

    ctx.register_catalog("lake", catalog)      # pyiceberg Catalog or DeltaDirectoryCatalog
    SELECT ... FROM lake.db.orders             # loads db.orders now, registers it, reads it
    INSERT INTO lake.db.orders SELECT ...      # the same, then distfusion.table_write.sql
    CREATE [OR REPLACE] TABLE lake.db.t [PARTITIONED BY (c, ...)] AS SELECT ...
    SHOW TABLES [FROM|IN lake[.db]]            # DataFusion's tables and the catalogs'
    CREATE TABLE t USING delta [PARTITIONED BY (c)] LOCATION 'path' AS SELECT ...

Registering a catalog reads nothing. A statement naming ``lake.ns.t`` loads
that table from its catalog (pyiceberg's ``load_table``, or delta-rs for a
:class:`~distfusion.table_write.delta_catalog.DeltaDirectoryCatalog`) and
registers it, as ``register_iceberg`` / ``register_delta`` do, under the bare
name ``"lake.ns.t"`` (:mod:`distfusion.table_write.catalog_names` rewrites
the statement to read it): every statement reads the table's current
snapshot or version; one loaded before and unchanged since (same metadata
file or version) is not registered again. Only ``SHOW TABLES`` and the error
for a missing table list a catalog.

``CREATE TABLE lake.ns.t AS query`` runs ``query`` distributed: for Iceberg
the table is created through the catalog with the query's schema (every
column optional, as Spark creates it; ``PARTITIONED BY`` columns as identity
partitions), then the rows are one append commit
(:func:`~distfusion.table_write.iceberg.write_iceberg`); for Delta, the
table's first commit holds the rows
(:func:`~distfusion.table_write.delta.write_delta`). When the query or the
commit fails, the files written are deleted and the table does not exist.

``CREATE OR REPLACE TABLE lake.ns.t AS query`` of an existing Delta table is
one overwrite commit with the query's schema and ``PARTITIONED BY`` columns
(delta-rs's ``schema_mode="overwrite"``: new metadata, every old file
removed, the new ones added; the old versions stay readable). pyiceberg 0.12
has no atomic replace of a table's schema and contents, so the statement is
refused for an existing Iceberg table (the error says what to do instead);
for a table that does not exist it is ``CREATE TABLE AS``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType

from distfusion.coordinator.ddl import fold_identifier, sql_tokens
from distfusion.coordinator.hosts import ContextHost
from distfusion.errors import PlanningError
from distfusion.io import delta, object_store
from distfusion.io.sources import sql_name
from distfusion.io.write import file_schema
from distfusion.table_write.catalog_names import (
    TableName,
    find_names,
    internal_name,
    rewrite_names,
)
from distfusion.table_write.delta import write_delta
from distfusion.table_write.delta_catalog import DeltaDirectoryCatalog
from distfusion.table_write.iceberg import write_iceberg

__all__ = ["CatalogMounts", "MountedCatalogs"]

_SHOW_TABLES = re.compile(r"^\s*SHOW\s+TABLES(?:\s+(?:FROM|IN)\s+([^\s;]+))?\s*$", re.IGNORECASE)
SHOW_TABLES_SCHEMA = pa.schema(
    [
        pa.field("table_catalog", pa.string(), nullable=False),
        pa.field("table_schema", pa.string(), nullable=False),
        pa.field("table_name", pa.string(), nullable=False),
        pa.field("table_type", pa.string(), nullable=False),
    ]
)
"""The columns of DataFusion's ``SHOW TABLES``."""


@dataclass
class MountedCatalogs:
    """A context's mounted catalogs (name -> catalog) and the tables loaded from them."""

    catalogs: dict[str, Any] = field(default_factory=dict)
    loaded: dict[str, Any] = field(default_factory=dict)  # internal name -> what was loaded


@dataclass(frozen=True)
class _CreateAs:
    name: TableName
    if_not_exists: bool
    partition_by: list[tuple[str, str, int | None]]  # (column, transform, its width)
    query: str
    replace: bool = False


class CatalogMounts(ContextHost):
    """Catalogs mounted on a DistributedContext (a mixin).

    Uses the context's ``sources``, ``ctx``, ``sql``, ``register_iceberg`` and
    ``register_delta``.
    """

    @property
    def _mounted(self) -> MountedCatalogs:
        state = self.__dict__.get("_mounted_catalogs")
        if state is None:
            state = self.__dict__["_mounted_catalogs"] = MountedCatalogs()
        return state

    def register_catalog(self, name: str, catalog: Any) -> None:
        """Mount ``catalog`` as ``name``: its tables are ``name.namespace.table`` in SQL.

        Nothing is read now: a table is loaded from the catalog when a
        statement names it (each statement reads its current snapshot or
        version), and registered under the bare name ``"name.namespace.table"``
        (:meth:`table_names` lists it then). ``SELECT``, ``INSERT INTO`` /
        ``INSERT OVERWRITE``, ``MERGE INTO``, ``CREATE TABLE
        name.ns.t [PARTITIONED BY (c, ...)] AS query`` and ``SHOW TABLES``
        take such names (:mod:`distfusion.table_write.catalogs`). Mounting
        another catalog under the same name replaces it.

        Args:
            name: the catalog's name in SQL (folds to lower case unless
                double-quoted, as an identifier).
            catalog: a pyiceberg ``Catalog`` (REST, SQL, Glue, Hive, ...:
                ``pyiceberg.catalog.load_catalog``), or a
                :class:`~distfusion.DeltaDirectoryCatalog`.

        Raises:
            TypeError: ``catalog`` is neither.

        Example:
            >>> import tempfile
            >>> from distfusion import DeltaDirectoryCatalog, DistributedContext, LocalRuntime
            >>> ctx = DistributedContext(runtime=LocalRuntime())
            >>> ctx.register_catalog("lake", DeltaDirectoryCatalog(tempfile.mkdtemp()))
            >>> ctx.sql("CREATE TABLE lake.db.t AS SELECT 1 AS x").collect()
            []
            >>> ctx.sql("SELECT x FROM lake.db.t").to_pylist()
            [{'x': 1}]
        """
        if not isinstance(catalog, DeltaDirectoryCatalog) and not _is_iceberg_catalog(catalog):
            msg = (
                "catalog must be a pyiceberg Catalog or a distfusion.DeltaDirectoryCatalog, "
                f"got {type(catalog).__name__}"
            )
            raise TypeError(msg)
        key = name[1:-1] if len(name) >= 2 and name[0] == name[-1] == '"' else name.lower()
        self._mounted.catalogs[key] = catalog

    def _catalog_statement(self, sql: str) -> tuple[Any, str]:
        """``(result, None)`` for a statement handled here, else ``(None, sql rewritten)``.

        Handled: ``SHOW TABLES`` (with a catalog mounted) and ``CREATE TABLE
        catalog.ns.t AS``. Other statements get the catalog tables they name
        loaded and registered, and their names rewritten to the bare names.

        Raises:
            PlanningError: a table named is not in its catalog (the message
                names catalog, namespace and table, and what exists), or
                cannot be loaded; a ``CREATE TABLE AS`` this cannot do; a
                ``DROP`` of a catalog table (drop it through its catalog).
        """
        at = _create_delta_at(sql)
        if at is not None:
            return self._create_delta_table_at(*at), sql
        mounts = self._mounted.catalogs
        if not mounts:
            return None, sql
        show = _SHOW_TABLES.match(sql)
        if show is not None:
            return self._show_tables(show.group(1)), sql
        create = _create_as(sql, mounts)
        if create is not None:
            return self._create_table_as_in_catalog(create), sql
        names = find_names(sql, mounts)
        if not names:
            return None, sql
        if sql.lstrip()[:4].upper() == "DROP":
            msg = (
                f"DROP of {internal_name(*names[0].parts)}: a mounted catalog's tables are "
                "dropped through the catalog (pyiceberg's drop_table, or deleting the Delta "
                "table's directory)"
            )
            raise PlanningError(msg)
        for n in dict.fromkeys((n.catalog, n.namespace, n.table) for n in names):
            self._load_catalog_table(*n)
        return None, rewrite_names(sql, names)

    def _catalog_table(self, name: str) -> str:
        """``name`` as the context knows it: ``lake.db.t`` loaded, as ``"lake.db.t"``; else as is.

        For :meth:`~distfusion.context.DistributedContext.table`.

        Raises:
            PlanningError: as for a statement naming the table.
        """
        names = find_names(name, self._mounted.catalogs)
        if len(names) != 1 or names[0].start != 0 or names[0].end != len(name.rstrip()):
            return name
        self._load_catalog_table(*names[0].parts)
        return sql_name(internal_name(*names[0].parts))

    # ------------------------------------------------------------- loading
    def _load_catalog_table(self, catalog: str, namespace: str, table: str) -> None:
        """Register ``catalog.namespace.table`` at its current version (when it changed)."""
        mounted = self._mounted.catalogs[catalog]
        internal = internal_name(catalog, namespace, table)
        if isinstance(mounted, DeltaDirectoryCatalog):
            uri = mounted.table_uri(namespace, table)
            try:
                dt = mounted.load_table(namespace, table)
            except ImportError:
                raise
            except Exception as exc:
                msg = f"cannot load the Delta table {internal} at {uri}: {exc}"
                raise PlanningError(object_store.redact(msg)) from exc
            if dt is None:
                raise self._missing(catalog, namespace, table)
            mark = (uri, dt.version())
            if self._mounted.loaded.get(internal) != mark or internal not in self.sources:
                self.register_delta(
                    sql_name(internal), dt, storage_options=mounted.options_for(uri)
                )
        else:
            from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

            try:
                loaded = mounted.load_table((namespace, table))
            except (NoSuchTableError, NoSuchNamespaceError):
                raise self._missing(catalog, namespace, table) from None
            except Exception as exc:
                msg = f"cannot load the Iceberg table {internal} from catalog {catalog!r}: {exc}"
                raise PlanningError(object_store.redact(msg)) from exc
            mark = loaded.metadata_location
            if self._mounted.loaded.get(internal) != mark or internal not in self.sources:
                self.register_iceberg(sql_name(internal), loaded)
        self._mounted.loaded[internal] = mark

    def _missing(self, catalog: str, namespace: str, table: str) -> PlanningError:
        """The error for ``catalog.namespace.table`` that its catalog does not hold."""
        mounted = self._mounted.catalogs[catalog]
        what = f"table {catalog}.{namespace}.{table} does not exist"
        try:
            namespaces = _namespaces(mounted)
            if namespace not in namespaces:
                listed = ", ".join(namespaces) or "none"
                msg = (
                    f"{what}: catalog {catalog!r} ({_describe(mounted)}) has no namespace "
                    f"{namespace!r} (its namespaces: {listed})"
                )
                return PlanningError(msg)
            tables = _tables(mounted, namespace)
        except Exception as exc:  # listing failed: say what was asked, and why no list
            return PlanningError(f"{what} in catalog {catalog!r} (cannot list it: {exc})")
        listed = ", ".join(tables) if tables else "it holds no table"
        msg = (
            f"{what}: namespace {namespace!r} of catalog {catalog!r} ({_describe(mounted)}) "
            f"has no table {table!r} ({listed})"
        )
        return PlanningError(msg)

    # ------------------------------------------------------------- SHOW TABLES
    def _show_tables(self, where: str | None) -> Any:
        """DataFusion's ``SHOW TABLES`` (catalog tables' bare names left out), the catalogs'."""
        mounts = self._mounted.catalogs
        prefix = None
        if where is not None:
            parts = [fold_identifier(p.strip('"'), p.startswith('"')) for p in where.split(".")]
            if parts[0] not in mounts:
                return self.ctx.sql(f"SHOW TABLES FROM {where}")
            prefix = parts
        rows = []
        if prefix is None:
            own = self.ctx.sql("SHOW TABLES").to_arrow_table().to_pylist()
            rows = [r for r in own if r["table_name"] not in self._mounted.loaded]
        for name, mounted in sorted(mounts.items()):
            if prefix is not None and name != prefix[0]:
                continue
            for ns in _namespaces(mounted):
                if prefix is not None and len(prefix) > 1 and ns != ".".join(prefix[1:]):
                    continue
                rows += [
                    {
                        "table_catalog": name,
                        "table_schema": ns,
                        "table_name": t,
                        "table_type": "BASE TABLE",
                    }
                    for t in _tables(mounted, ns)
                ]
        return self.ctx.from_arrow(pa.Table.from_pylist(rows, schema=SHOW_TABLES_SCHEMA))

    # ------------------------------------------------------------- CREATE TABLE AS
    def _create_delta_table_at(
        self, name: str, if_not_exists: bool, partition_by: list[str], location: str, query: str
    ) -> Any:
        """``CREATE TABLE name USING delta LOCATION 'location' AS query``; an empty result.

        The query runs distributed and its rows are version 0 of a new Delta
        table at ``location`` (:func:`~distfusion.table_write.delta.write_delta`),
        then registered as ``name`` (``register_delta``).

        Raises:
            PlanningError: a Delta table is already at ``location`` (without
                ``IF NOT EXISTS``); a ``PARTITIONED BY`` column not in the query.
        """
        done = self.ctx.from_arrow(pa.table({}))
        dl = delta.import_deltalake()
        options = delta.storage_options_for(location) if object_store.is_url(location) else None
        if object_store.is_url(location):
            self._stores_for(location)
        if dl.DeltaTable.is_deltatable(location, storage_options=options):
            if if_not_exists:
                self.register_delta(name, location)
                return done
            msg = f"CREATE TABLE {name}: a Delta table is already at {location}"
            raise PlanningError(msg)
        frame = self.sql(query)
        _check_columns(frame.schema(), partition_by, name)
        write_delta(frame, location, "append", partition_by or None)
        self.register_delta(name, location)
        return done

    # ------------------------------------------------------------- CREATE TABLE AS
    def _create_table_as_in_catalog(self, create: _CreateAs) -> Any:
        """Run ``create``'s query and make its table in the mounted catalog; an empty result."""
        catalog, namespace, table = create.name.parts
        mounted = self._mounted.catalogs[catalog]
        internal = internal_name(catalog, namespace, table)
        done = self.ctx.from_arrow(pa.table({}))
        if isinstance(mounted, DeltaDirectoryCatalog):
            uri = mounted.table_uri(namespace, table)
            exists = mounted.load_table(namespace, table) is not None
            if exists and create.if_not_exists:
                return done
            if exists and not create.replace:
                raise PlanningError(f"table {internal} already exists (a Delta table at {uri})")
            columns = _identity_columns(create.partition_by, internal)
            frame = self.sql(create.query)
            _check_columns(frame.schema(), columns, internal)
            if exists:  # one commit: new schema and partitioning, every old file removed
                write_delta(
                    frame,
                    uri,
                    "overwrite",
                    columns,
                    schema_mode="overwrite",
                    storage_options=mounted.storage_options,
                )
            else:
                write_delta(
                    frame, uri, "append", columns or None, storage_options=mounted.storage_options
                )
            return done
        if mounted.table_exists((namespace, table)):
            if create.if_not_exists:
                return done
            if create.replace:
                msg = (
                    f"CREATE OR REPLACE TABLE {internal}: pyiceberg 0.12 cannot replace an "
                    "Iceberg table's schema and rows in one commit; to keep the schema and "
                    f"replace the rows, run INSERT OVERWRITE {internal} SELECT ...; to change "
                    f"the schema, drop the table through the catalog (catalog.drop_table"
                    f"({namespace + '.' + table!r})) and run CREATE TABLE {internal} AS ..."
                )
                raise PlanningError(msg)
            raise PlanningError(f"table {internal} already exists in catalog {catalog!r}")
        frame = self.sql(create.query)
        schema = _iceberg_arrow_schema(frame.schema())
        _check_columns(schema, [c for c, _, _ in create.partition_by], internal)
        try:
            transaction = mounted.create_table_transaction((namespace, table), schema=schema)
            if create.partition_by:
                with transaction.update_spec() as spec:
                    for column, transform, width in create.partition_by:
                        spec.add_field(column, _iceberg_transform(transform, width))
            transaction.commit_transaction()
        except Exception as exc:
            msg = f"cannot create the Iceberg table {internal} in catalog {catalog!r}: {exc}"
            raise PlanningError(object_store.redact(msg)) from exc
        created = mounted.load_table((namespace, table))
        try:
            write_iceberg(frame, created, "append")
        except BaseException:
            _drop_iceberg(mounted, created)
            raise
        return done


def _is_iceberg_catalog(catalog: Any) -> bool:
    try:
        from pyiceberg.catalog import Catalog
    except ImportError:
        return False
    return isinstance(catalog, Catalog)


def _describe(mounted: Any) -> str:
    if isinstance(mounted, DeltaDirectoryCatalog):
        return f"Delta tables below {mounted.root}"
    return f"pyiceberg {type(mounted).__name__} {getattr(mounted, 'name', '')!r}"


def _namespaces(mounted: Any) -> list[str]:
    if isinstance(mounted, DeltaDirectoryCatalog):
        return mounted.list_namespaces()
    return sorted(".".join(ns) for ns in mounted.list_namespaces())


def _tables(mounted: Any, namespace: str) -> list[str]:
    if isinstance(mounted, DeltaDirectoryCatalog):
        return mounted.list_tables(namespace)
    return sorted(ident[-1] for ident in mounted.list_tables(tuple(namespace.split("."))))


def _create_as(sql: str, mounts: dict) -> _CreateAs | None:
    """``CREATE [OR REPLACE] TABLE [IF NOT EXISTS] cat.ns.t [PARTITIONED BY (cols)] AS query``.

    None for any other statement.

    Raises:
        PlanningError: ``CREATE TABLE`` of a catalog table without ``AS`` (not
            supported); ``OR REPLACE`` with ``IF NOT EXISTS`` (Spark refuses it too).
    """
    try:
        tokens = sql_tokens(sql)
    except TokenError:
        return None
    if len(tokens) < 2 or tokens[0].token_type != TokenType.CREATE:
        return None
    i = 1
    replace = tokens[i].token_type == TokenType.OR
    if replace:
        i += 2
    if i >= len(tokens) or tokens[i].token_type != TokenType.TABLE:
        return None
    i += 1
    if_not_exists = [t.text.upper() for t in tokens[i : i + 3]] == ["IF", "NOT", "EXISTS"]
    if if_not_exists:
        i += 3
    names = find_names(sql, mounts)
    if not names or i >= len(tokens) or names[0].start != tokens[i].start:
        return None
    name = names[0]
    if replace and if_not_exists:
        msg = (
            f"CREATE OR REPLACE TABLE IF NOT EXISTS {internal_name(*name.parts)}: "
            "OR REPLACE and IF NOT EXISTS cannot both be given"
        )
        raise PlanningError(msg)
    while i < len(tokens) and tokens[i].start < name.end:
        i += 1
    partition_by: list[tuple[str, str, int | None]] = []
    if i < len(tokens) and tokens[i].token_type == TokenType.PARTITION_BY:
        close = _closing(tokens, i + 1)
        if close is None:
            return None
        inner = sql[tokens[i + 1].end + 1 : tokens[close].start]
        partition_by = _partition_fields(inner, internal_name(*name.parts))
        i = close + 1
    if i >= len(tokens) or tokens[i].token_type != TokenType.ALIAS:
        msg = (
            f"CREATE TABLE {internal_name(*name.parts)} needs AS query (a catalog table takes "
            "its schema from a query here; create it through its catalog otherwise)"
        )
        raise PlanningError(msg)
    query = sql[tokens[i].end + 1 :].strip()
    return _CreateAs(name, if_not_exists, partition_by, query, replace)


def _create_delta_at(sql: str) -> tuple[str, bool, list[str], str, str] | None:
    """``CREATE TABLE [IF NOT EXISTS] t USING delta [PARTITIONED BY (c, ...)] LOCATION 'p' AS q``.

    ``(t as written, if_not_exists, partition columns, location, query)``;
    None for any other statement (``PARTITIONED BY`` and ``LOCATION`` in
    either order, as Spark takes them).

    Example:
        >>> _create_delta_at("CREATE TABLE t USING DELTA LOCATION '/x' AS SELECT 1")
        ('t', False, [], '/x', 'SELECT 1')
    """
    try:
        tokens = sql_tokens(sql)
    except TokenError:
        return None
    texts = [t.text.upper() for t in tokens]
    if texts[:2] != ["CREATE", "TABLE"]:
        return None
    i = 2
    if_not_exists = texts[i : i + 3] == ["IF", "NOT", "EXISTS"]
    i += 3 if if_not_exists else 0
    if i + 2 >= len(tokens) or texts[i + 1 : i + 3] != ["USING", "DELTA"]:
        return None
    name = sql[tokens[i].start : tokens[i].end + 1]
    i += 3
    partition_by: list[str] = []
    location = None
    while i < len(tokens) and tokens[i].token_type != TokenType.ALIAS:
        if tokens[i].token_type == TokenType.PARTITION_BY and i + 1 < len(tokens):
            close = next(
                (k for k in range(i, len(tokens)) if tokens[k].token_type == TokenType.R_PAREN),
                len(tokens) - 1,
            )
            partition_by += [
                fold_identifier(t.text, t.token_type == TokenType.IDENTIFIER)
                for t in tokens[i + 2 : close]
                if t.token_type != TokenType.COMMA
            ]
            i = close + 1
        elif texts[i] == "LOCATION" and i + 1 < len(tokens):
            location = tokens[i + 1].text
            i += 2
        else:
            return None  # another clause (OPTIONS, TBLPROPERTIES, ...): not handled here
    if location is None or i >= len(tokens):
        return None
    return name, if_not_exists, partition_by, location, sql[tokens[i].end + 1 :].strip()


_TRANSFORMS = {
    "identity": "identity",
    "year": "year",
    "years": "year",
    "month": "month",
    "months": "month",
    "day": "day",
    "days": "day",
    "date": "day",
    "hour": "hour",
    "hours": "hour",
    "truncate": "truncate",
}
"""``PARTITIONED BY`` functions (Spark's Iceberg DDL names and DataFusion's) -> transform.
Not bucket: :func:`~distfusion.table_write.iceberg.write_iceberg` does not compute it yet."""


def _closing(tokens: Sequence[Token], open_at: int) -> int | None:
    """The index of the ``)`` closing the ``(`` at ``open_at``; None when there is none."""
    if open_at >= len(tokens) or tokens[open_at].token_type != TokenType.L_PAREN:
        return None
    depth = 0
    for k in range(open_at, len(tokens)):
        if tokens[k].token_type == TokenType.L_PAREN:
            depth += 1
        elif tokens[k].token_type == TokenType.R_PAREN:
            depth -= 1
            if depth == 0:
                return k
    return None


def _partition_fields(inner: str, table: str) -> list[tuple[str, str, int | None]]:
    """``PARTITIONED BY (...)``'s fields: ``(column, transform, width)``.

    A column is an identity partition; ``day(ts)``, ``days(ts)``, ``month``,
    ``year``, ``hour`` and ``truncate(width, col)`` (or ``truncate(col,
    width)``) are Iceberg's transforms.

    Example:
        >>> _partition_fields("p, days(ts), truncate(4, s)", "t")
        [('p', 'identity', None), ('ts', 'day', None), ('s', 'truncate', 4)]

    Raises:
        PlanningError: a field that is none of these (named).
    """
    out: list[tuple[str, str, int | None]] = []
    for item in _split_top(inner):
        call = _CALL.fullmatch(item)
        if call is None and _IDENT.fullmatch(item):
            out.append((_folded(item), "identity", None))
            continue
        transform = _TRANSFORMS.get(call.group(1).lower()) if call else None
        args = [a.strip() for a in call.group(2).split(",")] if call else []
        columns = [a for a in args if _IDENT.fullmatch(a)]
        widths = [int(a) for a in args if a.isdigit()]
        if (
            transform is None
            or len(columns) != 1
            or len(args) != 1 + (transform == "truncate")
            or len(widths) != (transform == "truncate")
        ):
            msg = (
                f"CREATE TABLE {table}: PARTITIONED BY {item} is not supported (a column, "
                "year/month/day/hour(column), truncate(width, column))"
            )
            raise PlanningError(msg)
        out.append((_folded(columns[0]), transform, widths[0] if widths else None))
    return out


_IDENT = re.compile(r'"(?:[^"]|"")+"|[A-Za-z_][\w$]*')
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(\s*(.*?)\s*\)", re.DOTALL)


def _split_top(text: str) -> list[str]:
    """``text`` cut at its commas outside parentheses, each part stripped."""
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:k].strip())
            start = k + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def _folded(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return fold_identifier(name, quoted=False)


def _identity_columns(fields: list[tuple[str, str, int | None]], table: str) -> list[str]:
    """The columns of identity partitions; Delta has no other (PlanningError naming it)."""
    other = [f"{t}({c})" for c, t, _ in fields if t != "identity"]
    if other:
        msg = f"CREATE TABLE {table}: a Delta table partitions by columns only, not {other}"
        raise PlanningError(msg)
    return [c for c, _, _ in fields]


def _iceberg_transform(transform: str, width: int | None) -> Any:
    from pyiceberg.transforms import (
        DayTransform,
        HourTransform,
        IdentityTransform,
        MonthTransform,
        TruncateTransform,
        YearTransform,
    )

    if transform == "truncate":
        assert width is not None  # _partition_fields gives truncate its width
        return TruncateTransform(width)
    kinds = {
        "identity": IdentityTransform,
        "year": YearTransform,
        "month": MonthTransform,
        "day": DayTransform,
        "hour": HourTransform,
    }
    return kinds[transform]()


def _check_columns(schema: pa.Schema, partition_by: list[str], table: str) -> None:
    unknown = [c for c in partition_by if c not in schema.names]
    if unknown:
        msg = (
            f"CREATE TABLE {table}: PARTITIONED BY column(s) {unknown} are not columns of the "
            f"query ({', '.join(schema.names)})"
        )
        raise PlanningError(msg)


def _iceberg_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """The query's schema as an Iceberg table takes it: file types, every column optional."""
    plain = file_schema(schema)
    return pa.schema([f.with_nullable(True).with_metadata(None) for f in plain])


def _drop_iceberg(mounted: Any, table: Any) -> None:
    """Drop ``table`` from its catalog and delete the metadata file its creation wrote."""
    try:
        mounted.drop_table(table.name())
    except Exception:  # pragma: no cover - dropping what was just created
        return
    try:
        table.io.delete(table.metadata_location)
    except Exception:  # pragma: no cover - a metadata file left is harmless
        pass
