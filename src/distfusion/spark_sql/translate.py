"""Spark SQL -> DataFusion SQL with Spark's semantics, or :class:`SparkSemanticsError` why not.

The query is parsed with sqlglot's Spark reader, its columns resolved and
typed against the registered tables (sqlglot's ``qualify`` and
``annotate_types``), and every node of the tree is checked against one table
of rules (:data:`RULES`): a node passes as it is (its meaning is the same in
both engines), is rewritten into DataFusion SQL that computes Spark's answer,
or stops the translation with the reason. A node without a rule stops it
too: nothing is translated on the hope that it means the same (Apache
DataFusion Comet's rule: an expression it does not know runs on Spark).

What the rewrites do, each for a measured difference:

- ``ORDER BY``: NULLs first ascending, last descending (Spark's order), written
  out on every sort key;
- ``/``: a double unless a decimal is involved (DataFusion divides integers
  as integers); a decimal quotient gets Spark's precision and scale
  (:func:`~distfusion.spark_sql.types.divide_type`), rounded half up;
- decimal ``+ - *``, ``avg``, ``round``, ``CASE`` and ``coalesce``: Spark's
  result type (:mod:`distfusion.spark_sql.types`), rounded half up where
  Spark rounds;
- integer ``+ - *``: Spark's width; with ANSI mode (``spark.sql.ansi.enabled``)
  an overflow fails the query, without it the value wraps, as in Spark;
- division by zero: NULL, or with ANSI mode an error;
- ``if``, ``RLIKE``, ``concat``: DataFusion's functions of the same meaning
  (``concat`` is NULL when an argument is, as Spark's).

The output is SQL for DataFusion's Databricks parser dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.generators.spark import SparkGenerator
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, traverse_scope

from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import types as st
from distfusion.spark_sql.collection_rules import COLLECTION_RULES, without_generators
from distfusion.spark_sql.hints import apply_hints
from distfusion.spark_sql.nodes import T, cast_to, is_iso_date, paren, unsupported
from distfusion.spark_sql.number_rules import (
    NAMED_NUMBER_RULES,
    NUMBER_RULES,
    check_percentile_arguments,
)
from distfusion.spark_sql.parsing import JavaPatterns
from distfusion.spark_sql.struct_rules import NAMED_STRUCT_RULES, STRUCT_RULES, struct_type
from distfusion.spark_sql.time_rules import TIME_RULES, compared, rule_cast, shifted_date

__all__ = ["PARSER_SETTINGS", "RULES", "SparkSettings", "parse", "table_names", "translate"]

PARSER_SETTINGS = {
    "datafusion.sql_parser.dialect": "databricks",
    "datafusion.sql_parser.default_null_ordering": "nulls_min",
    "datafusion.sql_parser.parse_float_as_decimal": "true",
}
"""DataFusion settings the translated SQL is planned with: Spark's NULL order
and decimal literals (``1.5`` is ``decimal(2,1)``, as in Spark)."""


@dataclass(frozen=True)
class SparkSettings:
    """The Spark SQL settings a translation follows.

    Attributes:
        ansi: ``spark.sql.ansi.enabled`` (Spark 4's default: True): integer
            overflow and division by zero fail the query; off, an overflow
            wraps and a division by zero is NULL.
        allow_precision_loss: ``spark.sql.decimalOperations.allowPrecisionLoss``
            (default True). False: decimal arithmetic past 38 digits is not
            translated.
        time_zone: ``spark.sql.session.timeZone`` (default here: UTC): the zone
            of local times (:mod:`distfusion.spark_sql.time_rules`).
        time_parser_policy: ``spark.sql.legacy.timeParserPolicy`` (Spark 4's
            default: CORRECTED). LEGACY: strings are not read as dates here.
        timestamp_ntz: ``spark.sql.timestampType`` is ``TIMESTAMP_NTZ``
            (``to_timestamp`` of a string is not translated then).
    """

    ansi: bool = True
    allow_precision_loss: bool = True
    time_zone: str = "UTC"
    time_parser_policy: str = "CORRECTED"
    timestamp_ntz: bool = False

    @classmethod
    def of_session(cls, spark) -> SparkSettings:
        """The settings of SparkSession ``spark`` (classic or Connect)."""

        def text(key: str, default: str) -> str:
            try:
                return str(spark.conf.get(key, default))
            except Exception:  # Spark's: a setting it does not expose
                return default

        def flag(key: str, default: str) -> bool:
            return text(key, default).lower() == "true"

        try:
            zone = str(spark.conf.get("spark.sql.session.timeZone"))
        except Exception:  # Spark's: a setting it does not expose
            zone = "UTC"
        return cls(
            ansi=flag("spark.sql.ansi.enabled", "true"),
            allow_precision_loss=flag("spark.sql.decimalOperations.allowPrecisionLoss", "true"),
            time_zone=zone,
            time_parser_policy=text("spark.sql.legacy.timeParserPolicy", "CORRECTED"),
            timestamp_ntz=text("spark.sql.timestampType", "").upper() == "TIMESTAMP_NTZ",
        )


class _Writer(Spark):
    """Spark's SQL text, with every sort key's NULL order written out.

    sqlglot omits ``NULLS FIRST/LAST`` where it is the writing dialect's
    default, whatever the reading parser's default is: ``ORDER BY x NULLS
    LAST`` came out as ``ORDER BY x``, which DataFusion (NULLs small) sorts
    NULLs first. Every sort key, in ``ORDER BY`` and in windows, says its
    NULL order, so the text means the same under any parser setting.
    """

    class Generator(SparkGenerator):  # Spark.Generator
        def ordered_sql(self, expression: exp.Ordered) -> str:
            desc = expression.args.get("desc")
            order = " DESC" if desc else (" ASC" if desc is False else "")
            nulls = " NULLS FIRST" if expression.args.get("nulls_first") else " NULLS LAST"
            return f"{self.sql(expression, 'this')}{order}{nulls}"


def translate(
    query: str,
    schema_of: Callable[[str], pa.Schema | None],
    settings: SparkSettings | None = None,
    functions: Collection[str] = frozenset(),
) -> str:
    """DataFusion SQL that answers Spark SQL ``query`` as Spark does.

    Plan the result with :data:`PARSER_SETTINGS` set.

    Args:
        query: one Spark SQL query (``SELECT``, ``WITH``, set operations).
        schema_of: the schema of a table the query names (its lower-case
            name), as registered in the DataFusion context that plans the
            result; None for a name it does not know (a CTE's). Asked once
            per table the query names.
        settings: the session's Spark settings (default: Spark 4's).
        functions: names (lower case) of the context's Python UDFs: calls
            to them pass as written (they are the user's own functions). A
            mapping gives their Arrow return types too (None: not known),
            which the types of the expressions around a call need.

    Returns:
        The SQL text; its output columns are the query's, in order.

    Raises:
        SparkSemanticsError: ``query`` does not parse (sqlglot's parser
            names the line and column), a statement that is not a query, several
            statements, or a construct, function or type without a
            Spark-equal translation (the message names it).
    """
    settings = settings or SparkSettings()
    ast = parse(query)
    catalog: dict[str, object] = {}
    for name in table_names(ast):
        schema = schema_of(name)
        if schema is None:
            continue
        mixed = [f.name for f in schema if f.name != f.name.lower()]
        if mixed:
            msg = f"table {name!r} has mixed-case column names ({mixed[0]!r})"
            raise SparkSemanticsError(msg)
        catalog[name] = {f.name: st.arrow_to_sql_type(f.type) for f in schema}
    try:
        ast = qualify(ast, schema=catalog, dialect="spark", identify=False)
        ast = annotate_types(
            ast, schema=catalog, dialect="spark", expression_metadata=_typed_udfs(functions)
        )
    except OptimizeError as exc:
        msg = f"its columns do not resolve against the tables distfusion reads: {exc}"
        raise SparkSemanticsError(msg) from exc
    return _Translator(settings, functions).run(ast).sql(dialect=_Writer, comments=False)


def _typed_udfs(functions: Collection[str]) -> dict | None:
    """Spark's type rules in sqlglot, with the return types of ``functions`` (a mapping)."""
    returns = functions if isinstance(functions, Mapping) else {}
    returns = {name: t for name, t in returns.items() if t is not None}
    if not returns:
        return None
    metadata = dict(Spark.EXPRESSION_METADATA)
    known = metadata.get(exp.Anonymous, {}).get("annotator")

    def annotate(annotator, node: exp.Anonymous) -> None:
        returned = returns.get(node.name.lower())
        if returned is not None:
            node.type = exp.DataType.build(st.arrow_to_sql_type(returned), dialect="spark")
        elif known is not None:
            known(annotator, node)
        else:
            node.type = exp.DataType.build("UNKNOWN")

    metadata[exp.Anonymous] = {"annotator": annotate}
    return metadata


# ----------------------------------------------------------------------------- types


def parse(query: str) -> exp.Query:
    """Spark SQL ``query`` as sqlglot's tree, every node of a class :data:`RULES` knows.

    What the translation needs no table for: a query that fails here runs on
    Spark SQL without registering a table or asking Spark for its schema.

    Raises:
        SparkSemanticsError: sqlglot's Spark parser rejects ``query``; several
            statements; a statement that is not a query; a construct without
            a rule (the outermost one, as the query wrote it).
    """
    try:
        statements = [s for s in sqlglot.parse(query, read=JavaPatterns) if s is not None]
    except ParseError as exc:  # Spark's own parser may still read it
        msg = f"sqlglot's Spark parser rejects it: {exc}"
        raise SparkSemanticsError(msg) from exc
    check_percentile_arguments(query)
    if len(statements) != 1:
        msg = f"{len(statements)} statements: Spark SQL runs one statement at a time"
        raise SparkSemanticsError(msg)
    ast = statements[0]
    if not isinstance(ast, exp.Query):
        msg = f"a {ast.key.upper()} statement, not a query: Spark SQL owns it"
        raise SparkSemanticsError(msg)
    ast = apply_hints(without_generators(ast))  # join hints: marker aliases for the planner
    _check_constructs(ast)
    return ast


def table_names(ast: exp.Expr) -> set[str]:
    """The lower-case names of the tables ``ast`` reads (CTEs and subqueries aside)."""
    ctes = {c.alias_or_name.lower() for c in ast.find_all(exp.CTE)}
    return {t.name.lower() for t in ast.find_all(exp.Table)} - ctes


def _check_constructs(ast: exp.Expr) -> None:
    """Raise for the outermost node whose class has no rule (the reason names what was written)."""
    for node in ast.walk(bfs=False):
        if type(node) not in RULES and type(node) not in _PASS:  # exact: no subclass
            raise SparkSemanticsError(unsupported(node))


def _literal_type(node: exp.Literal) -> exp.DataType:
    """Spark's type of a literal: ``1`` INT, ``1.5`` DECIMAL(2,1), ``1e3`` DOUBLE."""
    if node.is_string:
        return exp.DataType.build("STRING")
    text = node.this
    if "e" in text.lower():
        return exp.DataType.build("DOUBLE")
    if "." in text:
        whole, frac = text.split(".", 1)
        digits = len(whole.lstrip("0")) + len(frac)
        return exp.DataType.build(f"DECIMAL({max(digits, len(frac), 1)}, {len(frac)})")
    value = int(text)
    if -(2**31) <= value < 2**31:
        return exp.DataType.build("INT")
    if -(2**63) <= value < 2**63:
        return exp.DataType.build("BIGINT")
    return exp.DataType.build(f"DECIMAL({len(text)}, 0)")


def _known(t: exp.DataType | None) -> bool:
    return t is not None and t.this not in (T.UNKNOWN, T.NULL)


# ----------------------------------------------------------------------------- rules

_PASS = {
    # structure
    exp.Select,
    exp.Union,
    exp.Subquery,
    exp.With,
    exp.CTE,
    exp.From,
    exp.Join,
    exp.Where,
    exp.Having,
    exp.Order,
    exp.Ordered,
    exp.Limit,
    exp.Offset,
    exp.Alias,
    exp.TableAlias,
    exp.Table,
    exp.Identifier,
    exp.Column,
    exp.Star,
    exp.Tuple,
    exp.Paren,
    exp.Distinct,
    exp.Var,
    exp.DataType,
    exp.DataTypeParam,
    exp.Rollup,
    exp.Cube,
    exp.GroupingSets,
    # predicates
    exp.And,
    exp.Or,
    exp.Not,
    exp.Is,
    exp.Exists,
    exp.NullSafeEQ,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.ILike,
    # aggregates and windows whose values and types agree
    exp.Min,
    exp.Max,
    exp.Window,
    exp.WindowSpec,
    exp.RowNumber,
    exp.Rank,
    exp.DenseRank,
    # scalar functions whose values and types agree
    exp.Upper,
    exp.Lower,
    exp.Length,
    exp.DPipe,
    exp.Abs,
}
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


class _Translator:
    """One query's rewrite: Spark types of the nodes, then each node by its rule."""

    def __init__(self, settings: SparkSettings, functions: Collection[str]) -> None:
        self.settings = settings
        self.functions = functions
        self.types: dict[int, exp.DataType | None] = {}
        self.derived: dict[int, exp.Expr] = {}  # column -> the projection it reads

    def run(self, ast: exp.Expr) -> exp.Expr:
        self._link_derived_columns(ast)
        _check_constructs(ast)  # again: qualify() wrote nodes of its own
        nodes = list(ast.walk(bfs=False))
        for node in nodes:
            self.type_of(node)
        root = ast
        for node in reversed(nodes):  # children before parents
            rule = RULES.get(type(node))
            if isinstance(node, exp.Anonymous):  # functions sqlglot does not know, by name
                rule = NAMED_STRUCT_RULES.get(node.name.lower(), rule)
                rule = NAMED_NUMBER_RULES.get(node.name.lower(), rule)
            if rule is None:
                continue
            parent, key, index = node.parent, node.arg_key, node.index
            new = rule(self, node)
            if new is node:
                continue
            if new is None:  # dropped (a hint)
                node.pop()
                continue
            self.types[id(new)] = self.type_of(node)
            if parent is None:
                root = new
            else:
                assert key is not None  # a node with a parent is one of its args
                parent.set(key, new, index)
        return root

    def _link_derived_columns(self, ast: exp.Expr) -> None:
        """Columns of subqueries and CTEs take the type of the projection they read.

        sqlglot types those with its own rules; Spark's (a decimal product's
        scale) decide the values of what uses them.
        """
        for scope in traverse_scope(ast):
            for column in scope.columns:
                source = scope.sources.get(column.table)
                if not isinstance(source, Scope):
                    continue
                query = source.expression
                assert isinstance(query, exp.Query)  # a derived table's or a CTE's scope
                for projection in query.selects:  # a union's: its first query's
                    if projection.alias_or_name == column.name:
                        self.derived[id(column)] = projection
                        _check_filtered_constant(column, query, projection)
                        break

    # ------------------------------------------------------------------ Spark types
    def type_of(self, node: exp.Expr) -> exp.DataType | None:
        """Spark's type of ``node`` (memoized), or None when unknown."""
        key = id(node)
        if key not in self.types:
            self.types[key] = self._infer(node)
        return self.types[key]

    def _infer(self, node: exp.Expr) -> exp.DataType | None:
        if isinstance(node, exp.Literal):
            return _literal_type(node)
        if isinstance(node, exp.Column) and id(node) in self.derived:
            return self.type_of(self.derived[id(node)])
        if isinstance(node, exp.Paren | exp.Neg | exp.Alias):
            return self.type_of(node.this)
        if isinstance(node, exp.Cast):
            return node.to
        if isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div):
            return self._arithmetic_type(node)
        if isinstance(node, exp.Sum | exp.Avg):
            return self._aggregate_type(node)
        if isinstance(node, exp.Count):
            return exp.DataType.build("BIGINT")
        if isinstance(node, exp.Min | exp.Max):
            return self.type_of(node.this)
        if isinstance(node, exp.Case | exp.If | exp.Coalesce):
            return self.common_type(self._branches(node))
        if isinstance(node, exp.Window):
            return self.type_of(node.this)
        if isinstance(node, exp.ArrayAgg | exp.ArrayUniqueAgg):  # collect_list, collect_set
            element = self.type_of(node.this)
            return None if element is None else exp.DataType.build(f"ARRAY<{element.sql()}>")
        if isinstance(node, exp.ArraySort):
            return self.type_of(node.this)
        if isinstance(node, exp.Distinct) and len(node.expressions) == 1:
            return self.type_of(node.expressions[0])
        if (nested := struct_type(self, node)) is not None:
            return nested
        t = node.type if isinstance(node.type, exp.DataType) else None
        return t if _known(t) else None

    def _operand_decimal(self, node: exp.Expr) -> st.Decimal | None:
        t = self.type_of(node)
        if t is None:
            return None
        inner = node.this if isinstance(node, exp.Paren) else node
        literal = inner if isinstance(inner, exp.Literal) and not inner.is_string else None
        return st.decimal_of(t, literal)

    def _arithmetic_type(self, node: exp.Binary) -> exp.DataType | None:
        lt, rt = self.type_of(node.left), self.type_of(node.right)
        if lt is None or rt is None:
            return None
        if lt.this == T.DATE and isinstance(node, exp.Add | exp.Sub):
            days = st.is_integral(rt) and rt.this != T.BIGINT  # Spark's date_add / date_sub
            return lt if isinstance(node.right, exp.Interval) or days else None
        if st.is_fractional(lt) or st.is_fractional(rt):
            numeric = (
                st.is_fractional(t) or st.is_integral(t) or st.is_decimal(t) for t in (lt, rt)
            )
            return exp.DataType.build("DOUBLE") if all(numeric) else None
        if st.is_integral(lt) and st.is_integral(rt):
            if isinstance(node, exp.Div):
                return exp.DataType.build("DOUBLE")
            return st.wider_integral(lt, rt)
        a, b = self._operand_decimal(node.left), self._operand_decimal(node.right)
        if a is None or b is None:
            return None
        if isinstance(node, exp.Add | exp.Sub):
            return st.add_type(a, b).sql_type()
        if isinstance(node, exp.Mul):
            return st.multiply_type(a, b).sql_type()
        return st.divide_type(a, b).sql_type()

    def _aggregate_type(self, node: exp.Sum | exp.Avg) -> exp.DataType | None:
        t = self.type_of(node.this)
        if t is None:
            return None
        if st.is_integral(t):
            return exp.DataType.build("BIGINT" if isinstance(node, exp.Sum) else "DOUBLE")
        if st.is_fractional(t):
            return exp.DataType.build("DOUBLE")
        d = st.decimal_of(t)
        if d is None:
            return None
        return (st.sum_type(d) if isinstance(node, exp.Sum) else st.avg_type(d)).sql_type()

    def _branches(self, node: exp.Expr) -> list[exp.Expr]:
        if isinstance(node, exp.Case):
            out = [i.args["true"] for i in node.args.get("ifs") or []]
            return out + ([node.args["default"]] if node.args.get("default") else [])
        if isinstance(node, exp.If):
            return [node.args["true"]] + ([node.args["false"]] if node.args.get("false") else [])
        return [node.this, *node.expressions]

    def common_type(self, branches: list[exp.Expr]) -> exp.DataType | None:
        """Spark's wider type of CASE / IF / coalesce branches (NULL branches aside)."""
        typed = [self.type_of(b) for b in branches if not isinstance(b, exp.Null)]
        types = [t for t in typed if t is not None]
        if not typed or len(types) < len(typed):
            return None
        if all(t == types[0] for t in types):
            return types[0]
        if all(st.is_integral(t) for t in types):
            out = types[0]
            for t in types[1:]:
                out = st.wider_integral(out, t)
            return out
        if any(st.is_fractional(t) for t in types):
            ok = all(st.is_fractional(t) or st.is_integral(t) or st.is_decimal(t) for t in types)
            return exp.DataType.build("DOUBLE") if ok else None
        exact = [st.decimal_of(t) for t in types]
        decimals = [d for d in exact if d is not None]
        if len(decimals) < len(exact):
            return None
        scale = max(d.scale for d in decimals)
        digits = max(d.precision - d.scale for d in decimals) + scale
        if digits > st.MAX_PRECISION:
            return None
        return st.Decimal(digits, scale).sql_type()

    def need(self, node: exp.Expr, what: str) -> exp.DataType:
        """The Spark type of ``node``; unknown stops the translation."""
        t = self.type_of(node)
        if t is None:
            msg = f"{what} {node.sql('spark')!r}: the type of an operand is not known here"
            raise SparkSemanticsError(msg)
        return t


def _check_filtered_constant(
    column: exp.Column, source: exp.Expr, projection: exp.Expr
) -> None:
    """Raise for a ``WHERE`` on a constant column of a global aggregate's subquery.

    DataFusion 55 moves such a filter (a constant once the column is
    inlined) below the aggregate, which then answers one row where Spark's
    filter leaves none: ``SELECT * FROM (SELECT 1 AS z, count(*) AS n FROM
    t) WHERE z <> 1``.
    """
    if not isinstance(source, exp.Select) or source.args.get("group"):
        return
    if not isinstance(column.find_ancestor(exp.Where, exp.Select), exp.Where):
        return
    if not any(p.find(exp.AggFunc) for p in source.selects):
        return
    if projection.find(exp.Column, exp.AggFunc, exp.Window) is None:
        msg = f"a filter on {column.name!r}, a global aggregate's constant (DataFusion moves it)"
        raise SparkSemanticsError(msg)


def _zero_guard(t: _Translator, right: exp.Expr) -> exp.Expr:
    """The divisor with Spark's division by zero: NULL, or with ANSI mode an error.

    With ANSI mode, a zero divisor is divided by itself as an integer, which
    fails the query with DataFusion's "Divide by zero error".
    """
    if not t.settings.ansi:
        return exp.Nullif(this=right, expression=exp.Literal.number(0))
    failing = cast_to(
        exp.Div(this=cast_to(right.copy(), "INT"), expression=cast_to(right.copy(), "INT")),
        t.type_of(right) or "DOUBLE",
    )
    is_zero = exp.EQ(this=right.copy(), expression=exp.Literal.number(0))
    return exp.Case(ifs=[exp.If(this=is_zero, true=failing)], default=right)


def _rule_function(t: _Translator, node: exp.Anonymous) -> exp.Expr:
    """A function sqlglot does not know: one of the context's UDFs, or untranslatable."""
    if node.name.lower() in t.functions:
        return node
    raise SparkSemanticsError(unsupported(node))


def _rule_literal(t: _Translator, node: exp.Literal) -> exp.Expr:
    """``1e3``: a double in Spark; DataFusion reading decimals makes it ``decimal(1,-3)``."""
    if node.is_string or "e" not in node.this.lower():
        return node
    return cast_to(exp.Literal.string(node.this), "DOUBLE")


def _rule_arithmetic(t: _Translator, node: exp.Binary) -> exp.Expr:
    """``+ - *`` with Spark's result type and overflow behaviour."""
    out = t.need(node, "arithmetic")
    lt, rt = t.type_of(node.left), t.type_of(node.right)
    left, right = paren(node.left), paren(node.right)
    if out.this == T.DATE:
        if isinstance(node.right, exp.Interval):
            return node
        return shifted_date(left, right, subtract=isinstance(node, exp.Sub))
    if st.is_fractional(out):
        return node.__class__(this=cast_to(left, "DOUBLE"), expression=cast_to(right, "DOUBLE"))
    if st.is_integral(out):
        if not t.settings.ansi:  # wraps at Spark's width
            return node.__class__(this=cast_to(left, out), expression=cast_to(right, out))
        wide = "DECIMAL(20, 0)" if out.this == T.BIGINT else "BIGINT"
        inner = node.__class__(this=cast_to(left, wide), expression=cast_to(right, wide))
        return cast_to(inner, out)  # fails when the value does not fit Spark's type
    a = st.decimal_of(lt) if lt is not None else None
    b = st.decimal_of(rt) if rt is not None else None
    result = st.decimal_of(out)
    if a is None or b is None or result is None:  # typed as decimals: not reached
        raise SparkSemanticsError(unsupported(node))
    if isinstance(node, exp.Mul):
        natural = st.Decimal(a.precision + b.precision + 1, a.scale + b.scale)
    else:
        scale = max(a.scale, b.scale)
        natural = st.Decimal(max(a.precision - a.scale, b.precision - b.scale) + scale + 1, scale)
    if natural.precision > st.MAX_PRECISION and not t.settings.allow_precision_loss:
        msg = "decimal arithmetic past 38 digits with allowPrecisionLoss=false"
        raise SparkSemanticsError(msg)
    if natural.scale > st.MAX_PRECISION or (
        isinstance(node, exp.Add | exp.Sub) and result.scale < natural.scale
    ):
        msg = f"decimal arithmetic {node.sql('spark')!r} rounds past 38 digits"
        raise SparkSemanticsError(msg)
    # Exact in DataFusion at the natural scale; the cast rounds half up to Spark's.
    return cast_to(node.__class__(this=left, expression=right), out)


def _rule_divide(t: _Translator, node: exp.Div) -> exp.Expr:
    """``/``: a double for integers and doubles; a decimal as Spark types and rounds it."""
    out = t.need(node, "division")
    left, right = paren(node.left), paren(node.right)
    if st.is_fractional(out):
        divisor = _zero_guard(t, cast_to(right, "DOUBLE"))
        return exp.Div(this=cast_to(left, "DOUBLE"), expression=divisor)
    a, b = t._operand_decimal(node.left), t._operand_decimal(node.right)
    result = st.decimal_of(out)
    if a is None or b is None or result is None:
        raise SparkSemanticsError(unsupported(node))
    if (
        t.settings.allow_precision_loss is False
        and a.precision - a.scale + b.scale + max(6, a.scale + b.precision + 1) > st.MAX_PRECISION
    ):
        msg = "decimal division past 38 digits with allowPrecisionLoss=false"
        raise SparkSemanticsError(msg)
    # DataFusion's quotient has the dividend's scale + 4 digits, truncated; a
    # truncation one digit or more past Spark's scale, then rounded half up (the
    # cast), is the exact quotient rounded half up.
    scale = max(a.scale, result.scale - 3)
    precision = a.precision - a.scale + scale
    if precision > st.MAX_PRECISION or scale + 4 > st.MAX_PRECISION:
        msg = f"decimal division {node.sql('spark')!r} needs more than 38 digits here"
        raise SparkSemanticsError(msg)
    dividend = cast_to(left, f"DECIMAL({precision}, {scale})")
    divisor = _zero_guard(t, cast_to(right, b.sql_type()))
    return cast_to(exp.Div(this=dividend, expression=divisor), out)


def _rule_int_divide(t: _Translator, node: exp.IntDiv) -> exp.Expr:
    """``a div b``: integers only, a BIGINT truncated toward zero as in Spark."""
    lt, rt = t.need(node.left, "div"), t.need(node.right, "div")
    if not (st.is_integral(lt) and st.is_integral(rt)):
        raise SparkSemanticsError(unsupported(node))
    divisor: exp.Expr = cast_to(paren(node.right), "BIGINT")
    if not t.settings.ansi:
        divisor = exp.Nullif(this=divisor, expression=exp.Literal.number(0))
    return exp.Div(this=cast_to(paren(node.left), "BIGINT"), expression=divisor)


def _rule_mod(t: _Translator, node: exp.Mod) -> exp.Expr:
    """``a % b``: integers only (the sign of the dividend, as both engines do)."""
    lt, rt = t.need(node.left, "%"), t.need(node.right, "%")
    if not (st.is_integral(lt) and st.is_integral(rt)):
        raise SparkSemanticsError(unsupported(node))
    out = st.wider_integral(lt, rt)
    divisor: exp.Expr = cast_to(paren(node.right), out)
    if not t.settings.ansi:
        divisor = exp.Nullif(this=divisor, expression=exp.Literal.number(0))
    return exp.Mod(this=cast_to(paren(node.left), out), expression=divisor)


def _rule_sum(t: _Translator, node: exp.Sum) -> exp.Expr:
    t.need(node, "sum")
    return node


def _rule_avg(t: _Translator, node: exp.Avg) -> exp.Expr:
    """``avg``: a double, or Spark's decimal ``(p+4, s+4)`` rounded half up.

    DataFusion's decimal average truncates at ``s+4`` digits: averaging the
    values at one more digit of scale and rounding that half up (the cast)
    is the exact average rounded half up.
    """
    out = t.need(node, "avg")
    arg = node.this
    if isinstance(arg, exp.Distinct):
        raise SparkSemanticsError("avg(DISTINCT ...) has no Spark-equal translation")
    if st.is_fractional(out) and not st.is_decimal(t.type_of(arg)):
        new = exp.Avg(this=cast_to(arg, "DOUBLE"))
    else:
        d = st.known_decimal(t.need(arg, "avg"))  # DECIMAL avg: of a DECIMAL
        if d.precision + 1 > st.MAX_PRECISION:
            msg = f"avg over decimal({d.precision},{d.scale}) needs more than 38 digits here"
            raise SparkSemanticsError(msg)
        new = exp.Avg(this=cast_to(arg, f"DECIMAL({d.precision + 1}, {d.scale + 1})"))
        if isinstance(node.parent, exp.Window):
            t.types[id(new)] = out
            new.meta["spark_cast"] = out  # cast around the window (_rule_window)
            return new
        return cast_to(new, out)
    return new


def _rule_deviation(t: _Translator, node: exp.AggFunc) -> exp.Expr:
    """``stddev``, ``variance`` and their ``_samp`` / ``_pop``: over doubles, as Spark computes.

    One row's sample deviation is NULL in both (Spark 3.1+ without
    ``spark.sql.legacy.statisticalAggregate``).
    """
    at = t.need(node.this, node.sql_name().lower())
    if not (st.is_integral(at) or st.is_fractional(at) or st.is_decimal(at)):
        raise SparkSemanticsError(unsupported(node))
    if isinstance(node.this, exp.Distinct):
        raise SparkSemanticsError(f"{unsupported(node)} over DISTINCT values")
    t.types[id(node)] = exp.DataType.build("DOUBLE")
    return exp.Anonymous(this=_DEVIATIONS[type(node)], expressions=[cast_to(node.this, "DOUBLE")])


_DEVIATIONS = {
    exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp",
    exp.VariancePop: "var_pop",
}
"""Spark's deviation aggregates -> DataFusion's function of the same meaning."""


_RANKINGS = (exp.RowNumber, exp.Rank, exp.DenseRank, exp.Lag, exp.Lead)


def _rule_window(t: _Translator, node: exp.Window) -> exp.Expr:
    spec = node.args.get("spec")
    if isinstance(node.this, _RANKINGS) and spec is not None and spec.args.get("kind"):
        raise SparkSemanticsError("a ranking function with a window frame: Spark rejects most")
    spark_type = node.this.meta.get("spark_cast") if isinstance(node.this, exp.Expression) else None
    return cast_to(node, spark_type) if spark_type is not None else node


def _rule_branches(t: _Translator, node: exp.Expr) -> exp.Expr:
    """CASE / IF / coalesce: IF as CASE; a decimal result cast to Spark's wider type.

    Branches of types Spark widens otherwise than DataFusion (a string and a
    number) stop the translation.
    """
    out = t.type_of(node)
    if out is None and not all(isinstance(b, exp.Null) for b in t._branches(node)):
        raise SparkSemanticsError(f"{unsupported(node)}: its branches' types do not unify here")
    if isinstance(node, exp.If):
        ifs = [exp.If(this=node.this, true=node.args["true"])]
        node = exp.Case(ifs=ifs, default=node.args.get("false"))
    return cast_to(node, out) if st.is_decimal(out) else node


def _rule_if_inside_case(t: _Translator, node: exp.If) -> exp.Expr:
    # sqlglot represents CASE's WHEN branches as If nodes under Case.
    if isinstance(node.parent, exp.Case):
        return node
    return _rule_branches(t, node)


def _rule_concat(t: _Translator, node: exp.Concat) -> exp.Expr:
    """``concat``: NULL when any argument is (DataFusion's concat skips NULLs; ``||`` does not)."""
    args = node.expressions
    out = args[0]
    for arg in args[1:]:
        out = exp.DPipe(this=out, expression=arg)
    return exp.Paren(this=out) if len(args) > 1 else out


def _rule_regexp_like(t: _Translator, node: exp.RegexpLike) -> exp.Expr:
    """``RLIKE`` / ``REGEXP``: a match anywhere in the string, as DataFusion's ``regexp_like``."""
    return exp.Anonymous(this="regexp_like", expressions=[node.this, node.expression])


def _rule_like(t: _Translator, node: exp.Like) -> exp.Expr:
    pattern = node.expression
    if node.args.get("escape") or not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise SparkSemanticsError("LIKE with an escape or a pattern that is not a literal")
    if "\\" in pattern.this:
        raise SparkSemanticsError("LIKE pattern with a backslash")
    return node


def _comparable(t: _Translator, node: exp.Expr, left: exp.Expr, right: exp.Expr):
    """``left`` and ``right`` as Spark compares them: one type family, or a literal cast.

    A date with an ISO date literal, a timestamp with a string literal
    (:func:`~distfusion.spark_sql.time_rules.compared`).
    """
    lt, rt = t.need(left, "comparison"), t.need(right, "comparison")
    if {lt.this, rt.this} & {T.STRUCT, T.MAP}:  # struct_rules: Spark orders NULL fields first
        raise SparkSemanticsError(f"comparison {node.sql('spark')[:60]!r} of structs or maps")
    if _family(lt) == _family(rt):
        return left, right
    if (new := compared(t, right, lt)) is not None:
        return left, new
    if (new := compared(t, left, rt)) is not None:
        return new, right
    msg = f"comparison {node.sql('spark')!r} of a {lt.sql('spark')} with a {rt.sql('spark')}"
    raise SparkSemanticsError(msg + ": Spark's implicit casts differ from DataFusion's")


def _rule_compare(t: _Translator, node: exp.Binary) -> exp.Expr:
    """``= <> < <= > >=`` of two values Spark compares without an implicit cast of a column."""
    left, right = _comparable(t, node, node.left, node.right)
    if left is node.left and right is node.right:
        return node
    return node.__class__(this=left, expression=right)


def _rule_between(t: _Translator, node: exp.Between) -> exp.Expr:
    """``x BETWEEN low AND high``: each bound compared with ``x`` as :func:`_rule_compare`."""
    this = node.this
    _, low = _comparable(t, node, this, node.args["low"])
    _, high = _comparable(t, node, this, node.args["high"])
    return exp.Between(this=this, low=low, high=high)


def _rule_in(t: _Translator, node: exp.In) -> exp.Expr:
    """``x IN (a, b)``: each value compared with ``x`` as :func:`_rule_compare`."""
    if not node.expressions:  # a subquery: its column's type, as a join compares
        return node
    values = [_comparable(t, node, node.this, v)[1] for v in node.expressions]
    return node.__class__(this=node.this, expressions=values, is_global=node.args.get("is_global"))


def _family(t: exp.DataType) -> str:
    if st.is_integral(t) or st.is_fractional(t) or st.is_decimal(t):
        return "number"
    if t.this in (T.VARCHAR, T.CHAR, T.TEXT):
        return "string"
    return t.this.name


_SAFE_CASTS = {
    ("number", "number"),
    ("string", "string"),
    ("DATE", "DATE"),
    ("DATE", "string"),
    ("BOOLEAN", "BOOLEAN"),
}


def _rule_cast(t: _Translator, node: exp.Cast) -> exp.Expr:
    """Casts whose values agree: numbers to numbers, integers and dates to strings, ISO dates.

    A string to an integer or a DOUBLE: DataFusion parses what Spark parses
    alike, and fails on the rest (``'1.5'`` to an INT, ``'1d'``), which runs
    the query again on Spark SQL (``SparkDataFrame.collect``).
    """
    to = node.to
    src = t.type_of(node.this)
    arg = node.this
    if to.this == T.DATE and is_iso_date(arg):
        return node
    if (timed := rule_cast(t, node)) is not None:
        return timed
    if src is None:
        raise SparkSemanticsError(f"CAST of {arg.sql('spark')!r}: its type is not known here")
    pair = (_family(src), _family(to))
    if pair in _SAFE_CASTS and not (st.is_fractional(src) and st.is_integral(to)):
        return node
    if pair == ("number", "string") and st.is_integral(src):
        return node
    if pair == ("string", "number") and (st.is_integral(to) or to.this == T.DOUBLE):
        return node
    msg = f"CAST from {src.sql('spark')} to {to.sql('spark')}: the engines' casts differ"
    raise SparkSemanticsError(msg)


def _rule_try_cast(t: _Translator, node: exp.TryCast) -> exp.Expr:
    """Sqlglot reads Spark's ``CAST`` as ``TRY_CAST`` (NULL on failure, Spark without ANSI).

    With ANSI mode a failing cast fails the query (``CAST``); without, it is
    NULL (``TRY_CAST``). Either way only casts whose values agree pass.
    """
    out = _rule_cast(t, node)
    if out is not node:  # a timestamp's cast, rewritten
        return out
    kind = exp.Cast if t.settings.ansi else exp.TryCast
    return kind(this=node.this, to=node.to)


def _rule_substring(t: _Translator, node: exp.Substring) -> exp.Expr:
    start = node.args.get("start")
    if not (isinstance(start, exp.Literal) and not start.is_string and int(start.this) > 0):
        raise SparkSemanticsError("substring() from a position that is not a positive literal")
    return node


def _rule_grouping(t: _Translator, node: exp.Expr) -> exp.Expr:
    """``grouping(x)``: a TINYINT; only with ``CUBE``, ``ROLLUP`` or ``GROUPING SETS`` (Spark's)."""
    select = node.find_ancestor(exp.Select)
    group = select.args.get("group") if select is not None else None
    if group is None or not (
        any(group.args.get(k) for k in ("cube", "rollup", "grouping_sets"))
        or group.find(exp.Cube, exp.Rollup, exp.GroupingSets)
    ):
        raise SparkSemanticsError(
            "grouping() without CUBE, ROLLUP or GROUPING SETS: Spark rejects it"
        )
    return cast_to(node, "TINYINT")


def _rule_group(t: _Translator, node: exp.Group) -> exp.Expr:
    """Spark's ``GROUP BY a, b WITH CUBE | WITH ROLLUP | GROUPING SETS (...)`` written out.

    DataFusion reads the trailing form and ignores it (one group per ``(a,
    b)``): it becomes ``GROUP BY CUBE (a, b)``, ``ROLLUP (a, b)`` or
    ``GROUPING SETS (...)`` (the list before it only names the columns).
    """
    trailing = [k for k in ("cube", "rollup", "grouping_sets") if node.args.get(k)]
    if not trailing:
        return node
    keys = node.expressions
    if len(trailing) > 1 or any(
        isinstance(k, exp.Cube | exp.Rollup | exp.GroupingSets) for k in keys
    ):
        raise SparkSemanticsError(f"GROUP BY {node.sql('spark')[9:60]!r}: not translated")
    (spec,) = node.args[trailing[0]]
    if trailing[0] == "grouping_sets":
        named = {e.sql() for e in spec.find_all(exp.Expr) if e is not spec}
        if any(k.sql() not in named for k in keys):  # NULL in every set: DataFusion refuses it
            raise SparkSemanticsError("GROUP BY a column that no grouping set names")
        new = spec
    elif spec.expressions:  # not Spark's trailing form
        raise SparkSemanticsError(f"GROUP BY {node.sql('spark')[9:60]!r}: not translated")
    else:
        new = spec.__class__(expressions=[k.copy() for k in keys])
    return exp.Group(expressions=[new.copy()])


def _rule_set_all(t: _Translator, node: exp.Expr) -> exp.Expr:
    """``EXCEPT`` / ``INTERSECT``; their ``ALL`` forms are not translated.

    DataFusion 55 plans ``EXCEPT ALL`` as an anti join (no row of a value
    the right side holds, however often the left holds it) and ``INTERSECT
    ALL`` as a semi join (every left copy): not Spark's multiset answers.
    """
    if node.args.get("distinct") is False:
        raise SparkSemanticsError(f"{node.key.upper()} ALL: DataFusion's differs from Spark's")
    return node


def _rule_count(t: _Translator, node: exp.Count) -> exp.Expr:
    """``count``; ``count(DISTINCT a, b)`` (rows where neither is NULL) is not translated."""
    arg = node.this
    if isinstance(arg, exp.Distinct) and len(arg.expressions) > 1:
        raise SparkSemanticsError("count(DISTINCT ...) of several columns: not translated")
    return node


RULES: dict[type[exp.Expr], Callable[[_Translator, Any], exp.Expr | None]] = {
    exp.Literal: _rule_literal,
    exp.Anonymous: _rule_function,
    exp.Add: _rule_arithmetic,
    exp.Sub: _rule_arithmetic,
    exp.Mul: _rule_arithmetic,
    exp.Div: _rule_divide,
    exp.IntDiv: _rule_int_divide,
    exp.Mod: _rule_mod,
    exp.Neg: lambda t, n: n,
    exp.Sum: _rule_sum,
    exp.Avg: _rule_avg,
    exp.Window: _rule_window,
    **{c: _rule_deviation for c in _DEVIATIONS},
    exp.If: _rule_if_inside_case,
    exp.Case: _rule_branches,
    exp.Coalesce: _rule_branches,
    exp.Concat: _rule_concat,
    exp.RegexpLike: _rule_regexp_like,
    exp.Like: _rule_like,
    exp.Cast: _rule_cast,
    exp.TryCast: _rule_try_cast,
    exp.Hint: lambda t, n: None,
    exp.JoinHint: lambda t, n: None,
    exp.Substring: _rule_substring,
    exp.Grouping: _rule_grouping,
    exp.Group: _rule_group,
    exp.Count: _rule_count,
    exp.Except: _rule_set_all,
    exp.Intersect: _rule_set_all,
    **{c: _rule_compare for c in _COMPARISONS},
    exp.Between: _rule_between,
    exp.In: _rule_in,
    **TIME_RULES,
    **COLLECTION_RULES,
    **NUMBER_RULES,
    **STRUCT_RULES,  # after COLLECTION_RULES: size() of a map
}
"""Node class -> its rule: the node as it is, its Spark-equal rewrite, or
:class:`SparkSemanticsError`. Classes in ``_PASS`` pass unchanged; any other
class stops the translation."""
