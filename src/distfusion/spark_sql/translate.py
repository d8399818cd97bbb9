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

import re
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import OptimizeError, ParseError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, traverse_scope
from sqlglot.time import format_time

from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import types as st
from distfusion.spark_sql.datetime import to_chrono

__all__ = ["PARSER_SETTINGS", "RULES", "SparkSettings", "parse", "table_names", "translate"]

T = exp.DataType.Type

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
    """

    ansi: bool = True
    allow_precision_loss: bool = True

    @classmethod
    def of_session(cls, spark) -> SparkSettings:
        """The settings of SparkSession ``spark`` (classic or Connect)."""

        def flag(key: str, default: str) -> bool:
            try:
                return str(spark.conf.get(key, default)).lower() == "true"
            except Exception:  # Spark's: a setting it does not expose
                return default == "true"

        return cls(
            ansi=flag("spark.sql.ansi.enabled", "true"),
            allow_precision_loss=flag("spark.sql.decimalOperations.allowPrecisionLoss", "true"),
        )


class _Writer(Spark):
    """Spark's SQL text, with every sort key's NULL order written out.

    sqlglot omits ``NULLS FIRST/LAST`` where it is the dialect's default;
    declaring DataFusion's default (NULLs large) makes it write Spark's
    order wherever the two differ, so the text means the same under either
    parser setting.
    """

    NULL_ORDERING = "nulls_are_large"


def translate(
    query: str,
    schema_of: Callable[[str], pa.Schema | None],
    settings: SparkSettings | None = None,
    functions: frozenset[str] = frozenset(),
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
            to them pass as written (they are the user's own functions).

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
    catalog = {}
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
        ast = annotate_types(ast, schema=catalog, dialect="spark")
    except OptimizeError as exc:
        msg = f"its columns do not resolve against the tables distfusion reads: {exc}"
        raise SparkSemanticsError(msg) from exc
    return _Translator(settings, functions).run(ast).sql(dialect=_Writer, comments=False)


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
        statements = [s for s in sqlglot.parse(query, read="spark") if s is not None]
    except ParseError as exc:  # Spark's own parser may still read it
        msg = f"sqlglot's Spark parser rejects it: {exc}"
        raise SparkSemanticsError(msg) from exc
    if len(statements) != 1:
        msg = f"{len(statements)} statements: Spark SQL runs one statement at a time"
        raise SparkSemanticsError(msg)
    ast = statements[0]
    if not isinstance(ast, exp.Query):
        msg = f"a {ast.key.upper()} statement, not a query: Spark SQL owns it"
        raise SparkSemanticsError(msg)
    _check_constructs(ast)
    return ast


def table_names(ast: exp.Expression) -> set[str]:
    """The lower-case names of the tables ``ast`` reads (CTEs and subqueries aside)."""
    ctes = {c.alias_or_name.lower() for c in ast.find_all(exp.CTE)}
    return {t.name.lower() for t in ast.find_all(exp.Table)} - ctes


def _check_constructs(ast: exp.Expression) -> None:
    """Raise for the outermost node whose class has no rule (the reason names what was written)."""
    for node in ast.walk(bfs=False):
        if type(node) not in RULES and type(node) not in _PASS:  # exact: no subclass
            raise SparkSemanticsError(_unsupported(node))


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


_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _is_iso_date(node: exp.Expression) -> bool:
    """A string literal ``yyyy-mm-dd``: both engines read it as the same DATE."""
    return isinstance(node, exp.Literal) and node.is_string and bool(_ISO_DATE.match(node.this))


# ----------------------------------------------------------------------------- rules

_PASS = {
    # structure
    exp.Select,
    exp.Union,
    exp.Intersect,
    exp.Except,
    exp.Subquery,
    exp.With,
    exp.CTE,
    exp.From,
    exp.Join,
    exp.Where,
    exp.Group,
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
    exp.In,
    exp.Between,
    exp.Exists,
    exp.NullSafeEQ,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.ILike,
    # aggregates and windows whose values and types agree
    exp.Count,
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
    exp.ConcatWs,
    exp.DPipe,
    exp.Abs,
}
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


class _Translator:
    """One query's rewrite: Spark types of the nodes, then each node by its rule."""

    def __init__(self, settings: SparkSettings, functions: frozenset[str]) -> None:
        self.settings = settings
        self.functions = functions
        self.types: dict[int, exp.DataType] = {}
        self.derived: dict[int, exp.Expression] = {}  # column -> the projection it reads

    def run(self, ast: exp.Expression) -> exp.Expression:
        self._link_derived_columns(ast)
        _check_constructs(ast)  # again: qualify() wrote nodes of its own
        nodes = list(ast.walk(bfs=False))
        for node in nodes:
            self.type_of(node)
        root = ast
        for node in reversed(nodes):  # children before parents
            rule = RULES.get(type(node))
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
                parent.set(key, new, index)
        return root

    def _link_derived_columns(self, ast: exp.Expression) -> None:
        """Columns of subqueries and CTEs take the type of the projection they read.

        sqlglot types those with its own rules; Spark's (a decimal product's
        scale) decide the values of what uses them.
        """
        for scope in traverse_scope(ast):
            for column in scope.columns:
                source = scope.sources.get(column.table)
                if not isinstance(source, Scope):
                    continue
                for projection in source.expression.selects:  # a union's: its first query's
                    if projection.alias_or_name == column.name:
                        self.derived[id(column)] = projection
                        break

    # ------------------------------------------------------------------ Spark types
    def type_of(self, node: exp.Expression) -> exp.DataType | None:
        """Spark's type of ``node`` (memoized), or None when unknown."""
        key = id(node)
        if key not in self.types:
            self.types[key] = self._infer(node)
        return self.types[key]

    def _infer(self, node: exp.Expression) -> exp.DataType | None:
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
            return self._common_type(self._branches(node))
        if isinstance(node, exp.Window):
            return self.type_of(node.this)
        if isinstance(node, exp.Distinct) and len(node.expressions) == 1:
            return self.type_of(node.expressions[0])
        t = node.type if isinstance(node.type, exp.DataType) else None
        return t if _known(t) else None

    def _operand_decimal(self, node: exp.Expression) -> st.Decimal | None:
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

    def _branches(self, node: exp.Expression) -> list[exp.Expression]:
        if isinstance(node, exp.Case):
            out = [i.args["true"] for i in node.args.get("ifs") or []]
            return out + ([node.args["default"]] if node.args.get("default") else [])
        if isinstance(node, exp.If):
            return [node.args["true"]] + ([node.args["false"]] if node.args.get("false") else [])
        return [node.this, *node.expressions]

    def _common_type(self, branches: list[exp.Expression]) -> exp.DataType | None:
        """Spark's wider type of CASE / IF / coalesce branches (NULL branches aside)."""
        types = [self.type_of(b) for b in branches if not isinstance(b, exp.Null)]
        if not types or any(t is None for t in types):
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
        decimals = [st.decimal_of(t) for t in types]
        if any(d is None for d in decimals):
            return None
        scale = max(d.scale for d in decimals)
        digits = max(d.precision - d.scale for d in decimals) + scale
        if digits > st.MAX_PRECISION:
            return None
        return st.Decimal(digits, scale).sql_type()

    def need(self, node: exp.Expression, what: str) -> exp.DataType:
        """The Spark type of ``node``; unknown stops the translation."""
        t = self.type_of(node)
        if t is None:
            msg = f"{what} {node.sql('spark')!r}: the type of an operand is not known here"
            raise SparkSemanticsError(msg)
        return t


def _unsupported(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}() has no Spark-equal translation"
    if isinstance(node, exp.Func):  # Spark's name, as the query wrote it
        name = node.sql("spark").split("(", 1)[0].strip().lower() or node.sql_name().lower()
        return f"function {name}() has no Spark-equal translation"
    return f"{node.key.upper()} ({node.sql('spark')[:60]!r}) has no Spark-equal translation"


def _cast(node: exp.Expression, to: exp.DataType | str) -> exp.Cast:
    to = to if isinstance(to, exp.DataType) else exp.DataType.build(to)
    return exp.Cast(this=node, to=to.copy())


def _paren(node: exp.Expression) -> exp.Expression:
    return (
        node
        if isinstance(node, exp.Paren | exp.Column | exp.Literal | exp.Cast)
        else exp.Paren(this=node)
    )


def _zero_guard(t: _Translator, right: exp.Expression) -> exp.Expression:
    """The divisor with Spark's division by zero: NULL, or with ANSI mode an error.

    With ANSI mode, a zero divisor is divided by itself as an integer, which
    fails the query with DataFusion's "Divide by zero error".
    """
    if not t.settings.ansi:
        return exp.Nullif(this=right, expression=exp.Literal.number(0))
    failing = _cast(
        exp.Div(this=_cast(right.copy(), "INT"), expression=_cast(right.copy(), "INT")),
        t.type_of(right) or "DOUBLE",
    )
    is_zero = exp.EQ(this=right.copy(), expression=exp.Literal.number(0))
    return exp.Case(ifs=[exp.If(this=is_zero, true=failing)], default=right)


def _rule_function(t: _Translator, node: exp.Anonymous) -> exp.Expression:
    """A function sqlglot does not know: one of the context's UDFs, or untranslatable."""
    if node.name.lower() in t.functions:
        return node
    raise SparkSemanticsError(_unsupported(node))


def _rule_literal(t: _Translator, node: exp.Literal) -> exp.Expression:
    """``1e3``: a double in Spark; DataFusion reading decimals makes it ``decimal(1,-3)``."""
    if node.is_string or "e" not in node.this.lower():
        return node
    return _cast(exp.Literal.string(node.this), "DOUBLE")


def _rule_arithmetic(t: _Translator, node: exp.Binary) -> exp.Expression:
    """``+ - *`` with Spark's result type and overflow behaviour."""
    out = t.need(node, "arithmetic")
    lt, rt = t.type_of(node.left), t.type_of(node.right)
    left, right = _paren(node.left), _paren(node.right)
    if out.this == T.DATE:
        if isinstance(node.right, exp.Interval):
            return node
        return _shifted_date(left, right, subtract=isinstance(node, exp.Sub))
    if st.is_fractional(out):
        return node.__class__(this=_cast(left, "DOUBLE"), expression=_cast(right, "DOUBLE"))
    if st.is_integral(out):
        if not t.settings.ansi:  # wraps at Spark's width
            return node.__class__(this=_cast(left, out), expression=_cast(right, out))
        wide = "DECIMAL(20, 0)" if out.this == T.BIGINT else "BIGINT"
        inner = node.__class__(this=_cast(left, wide), expression=_cast(right, wide))
        return _cast(inner, out)  # fails when the value does not fit Spark's type
    a, b = st.decimal_of(lt), st.decimal_of(rt)
    result = st.decimal_of(out)
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
    return _cast(node.__class__(this=left, expression=right), out)


def _rule_divide(t: _Translator, node: exp.Div) -> exp.Expression:
    """``/``: a double for integers and doubles; a decimal as Spark types and rounds it."""
    out = t.need(node, "division")
    left, right = _paren(node.left), _paren(node.right)
    if st.is_fractional(out):
        divisor = _zero_guard(t, _cast(right, "DOUBLE"))
        return exp.Div(this=_cast(left, "DOUBLE"), expression=divisor)
    a, b = t._operand_decimal(node.left), t._operand_decimal(node.right)
    result = st.decimal_of(out)
    if a is None or b is None or result is None:
        raise SparkSemanticsError(_unsupported(node))
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
    dividend = _cast(left, f"DECIMAL({precision}, {scale})")
    divisor = _zero_guard(t, _cast(right, b.sql_type()))
    return _cast(exp.Div(this=dividend, expression=divisor), out)


def _rule_int_divide(t: _Translator, node: exp.IntDiv) -> exp.Expression:
    """``a div b``: integers only, a BIGINT truncated toward zero as in Spark."""
    lt, rt = t.need(node.left, "div"), t.need(node.right, "div")
    if not (st.is_integral(lt) and st.is_integral(rt)):
        raise SparkSemanticsError(_unsupported(node))
    divisor = _cast(_paren(node.right), "BIGINT")
    if not t.settings.ansi:
        divisor = exp.Nullif(this=divisor, expression=exp.Literal.number(0))
    return exp.Div(this=_cast(_paren(node.left), "BIGINT"), expression=divisor)


def _rule_mod(t: _Translator, node: exp.Mod) -> exp.Expression:
    """``a % b``: integers only (the sign of the dividend, as both engines do)."""
    lt, rt = t.need(node.left, "%"), t.need(node.right, "%")
    if not (st.is_integral(lt) and st.is_integral(rt)):
        raise SparkSemanticsError(_unsupported(node))
    out = st.wider_integral(lt, rt)
    divisor = _cast(_paren(node.right), out)
    if not t.settings.ansi:
        divisor = exp.Nullif(this=divisor, expression=exp.Literal.number(0))
    return exp.Mod(this=_cast(_paren(node.left), out), expression=divisor)


def _rule_sum(t: _Translator, node: exp.Sum) -> exp.Expression:
    t.need(node, "sum")
    return node


def _rule_avg(t: _Translator, node: exp.Avg) -> exp.Expression:
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
        new = exp.Avg(this=_cast(arg, "DOUBLE"))
    else:
        d = st.decimal_of(t.type_of(arg))
        if d.precision + 1 > st.MAX_PRECISION:
            msg = f"avg over decimal({d.precision},{d.scale}) needs more than 38 digits here"
            raise SparkSemanticsError(msg)
        new = exp.Avg(this=_cast(arg, f"DECIMAL({d.precision + 1}, {d.scale + 1})"))
        if isinstance(node.parent, exp.Window):
            t.types[id(new)] = out
            new.meta["spark_cast"] = out  # cast around the window (_rule_window)
            return new
        return _cast(new, out)
    return new


def _rule_deviation(t: _Translator, node: exp.AggFunc) -> exp.Expression:
    """``stddev``, ``variance`` and their ``_samp`` / ``_pop``: over doubles, as Spark computes.

    One row's sample deviation is NULL in both (Spark 3.1+ without
    ``spark.sql.legacy.statisticalAggregate``).
    """
    at = t.need(node.this, node.sql_name().lower())
    if not (st.is_integral(at) or st.is_fractional(at) or st.is_decimal(at)):
        raise SparkSemanticsError(_unsupported(node))
    if isinstance(node.this, exp.Distinct):
        raise SparkSemanticsError(f"{_unsupported(node)} over DISTINCT values")
    t.types[id(node)] = exp.DataType.build("DOUBLE")
    return exp.Anonymous(this=_DEVIATIONS[type(node)], expressions=[_cast(node.this, "DOUBLE")])


_DEVIATIONS = {
    exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp",
    exp.VariancePop: "var_pop",
}
"""Spark's deviation aggregates -> DataFusion's function of the same meaning."""


def _rule_window(t: _Translator, node: exp.Window) -> exp.Expression:
    cast_to = node.this.meta.get("spark_cast") if isinstance(node.this, exp.Expression) else None
    return _cast(node, cast_to) if cast_to is not None else node


def _rule_round(t: _Translator, node: exp.Round) -> exp.Expression:
    """``round(x, d)``: decimals (half up in both) and integers; not doubles.

    Spark rounds a double's decimal text, DataFusion its binary value:
    ``round(2.675, 2)`` differs.
    """
    xt = t.need(node.this, "round")
    digits = node.args.get("decimals")
    d = 0
    if digits is not None:
        if not (isinstance(digits, exp.Literal) and not digits.is_string):
            raise SparkSemanticsError("round() with digits that are not a number literal")
        d = int(digits.this)
    if d < 0:
        raise SparkSemanticsError("round() to negative digits has no Spark-equal translation")
    if st.is_integral(xt):
        return node.this
    dec = st.decimal_of(xt)
    if dec is None:
        msg = (
            f"round() of a {xt.sql('spark')}: Spark rounds its decimal text, "
            "DataFusion the binary value"
        )
        raise SparkSemanticsError(msg)
    out = st.round_type(dec, d).sql_type()
    t.types[id(node)] = out
    return _cast(node.this, out)  # DataFusion's cast to a smaller scale rounds half up


def _rule_branches(t: _Translator, node: exp.Expression) -> exp.Expression:
    """CASE / IF / coalesce: IF as CASE; a decimal result cast to Spark's wider type.

    Branches of types Spark widens otherwise than DataFusion (a string and a
    number) stop the translation.
    """
    out = t.type_of(node)
    if out is None and not all(isinstance(b, exp.Null) for b in t._branches(node)):
        raise SparkSemanticsError(f"{_unsupported(node)}: its branches' types do not unify here")
    if isinstance(node, exp.If):
        ifs = [exp.If(this=node.this, true=node.args["true"])]
        node = exp.Case(ifs=ifs, default=node.args.get("false"))
    return _cast(node, out) if st.is_decimal(out) else node


def _rule_if_inside_case(t: _Translator, node: exp.If) -> exp.Expression:
    # sqlglot represents CASE's WHEN branches as If nodes under Case.
    if isinstance(node.parent, exp.Case):
        return node
    return _rule_branches(t, node)


def _rule_concat(t: _Translator, node: exp.Concat) -> exp.Expression:
    """``concat``: NULL when any argument is (DataFusion's concat skips NULLs; ``||`` does not)."""
    args = node.expressions
    out = args[0]
    for arg in args[1:]:
        out = exp.DPipe(this=out, expression=arg)
    return exp.Paren(this=out) if len(args) > 1 else out


def _rule_regexp_like(t: _Translator, node: exp.RegexpLike) -> exp.Expression:
    """``RLIKE`` / ``REGEXP``: a match anywhere in the string, as DataFusion's ``regexp_like``."""
    return exp.Anonymous(this="regexp_like", expressions=[node.this, node.expression])


def _rule_like(t: _Translator, node: exp.Like) -> exp.Expression:
    pattern = node.expression
    if node.args.get("escape") or not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise SparkSemanticsError("LIKE with an escape or a pattern that is not a literal")
    if "\\" in pattern.this:
        raise SparkSemanticsError("LIKE pattern with a backslash")
    return node


def _rule_compare(t: _Translator, node: exp.Binary) -> exp.Expression:
    """Comparisons: both sides of one type family, or a date with an ISO date literal."""
    lt, rt = t.need(node.left, "comparison"), t.need(node.right, "comparison")
    if _family(lt) == _family(rt):
        return node
    if (lt.this == T.DATE and _is_iso_date(node.right)) or (
        rt.this == T.DATE and _is_iso_date(node.left)
    ):
        return node
    msg = f"comparison {node.sql('spark')!r} of a {lt.sql('spark')} with a {rt.sql('spark')}"
    raise SparkSemanticsError(msg + ": Spark's implicit casts differ from DataFusion's")


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


def _rule_cast(t: _Translator, node: exp.Cast) -> exp.Expression:
    """Casts whose values agree: numbers to numbers, integers and dates to strings, ISO dates."""
    to = node.to
    src = t.type_of(node.this)
    arg = node.this
    if to.this == T.DATE and _is_iso_date(arg):
        return node
    if src is None:
        raise SparkSemanticsError(f"CAST of {arg.sql('spark')!r}: its type is not known here")
    pair = (_family(src), _family(to))
    if pair in _SAFE_CASTS and not (st.is_fractional(src) and st.is_integral(to)):
        return node
    if pair == ("number", "string") and st.is_integral(src):
        return node
    msg = f"CAST from {src.sql('spark')} to {to.sql('spark')}: the engines' casts differ"
    raise SparkSemanticsError(msg)


def _rule_try_cast(t: _Translator, node: exp.TryCast) -> exp.Expression:
    """Sqlglot reads Spark's ``CAST`` as ``TRY_CAST`` (NULL on failure, Spark without ANSI).

    With ANSI mode a failing cast fails the query (``CAST``); without, it is
    NULL (``TRY_CAST``). Either way only casts whose values agree pass.
    """
    _rule_cast(t, node)
    kind = exp.Cast if t.settings.ansi else exp.TryCast
    return kind(this=node.this, to=node.to)


def _rule_to_date(t: _Translator, node: exp.TsOrDsToDate) -> exp.Expression:
    """A date function's argument as sqlglot reads it: a DATE, or an ISO date literal."""
    if _is_iso_date(node.this) and not node.args.get("format"):
        return _cast(node.this, "DATE")
    at = t.type_of(node.this)
    if at is None or at.this != T.DATE or node.args.get("format"):
        raise SparkSemanticsError("to_date() of a string has no Spark-equal translation")
    return node.this


def _rule_substring(t: _Translator, node: exp.Substring) -> exp.Expression:
    start = node.args.get("start")
    if not (isinstance(start, exp.Literal) and not start.is_string and int(start.this) > 0):
        raise SparkSemanticsError("substring() from a position that is not a positive literal")
    return node


_DATE_PARTS = {
    exp.Year: "YEAR",
    exp.Month: "MONTH",
    exp.Day: "DAY",
    exp.DayOfMonth: "DAY",
    exp.Quarter: "QUARTER",
    exp.DayOfYear: "DOY",
    exp.WeekOfYear: "WEEK",  # ISO 8601 weeks in both
    exp.DayOfWeek: "DOW",  # DataFusion's 0 is Sunday, Spark's 1
}


def _rule_date_part(t: _Translator, node: exp.Expression) -> exp.Expression:
    """``year(d)``, ``dayofweek(d)``, ``EXTRACT(... FROM d)`` of a DATE (INT in both)."""
    arg = node.expression if isinstance(node, exp.Extract) else node.this
    at = t.type_of(arg)
    if at is None or at.this != T.DATE:
        raise SparkSemanticsError(f"{_unsupported(node)} over a non-DATE argument")
    if isinstance(node, exp.Extract):
        unit = node.this.name.upper()
        if unit not in ("YEAR", "MONTH", "DAY", "QUARTER"):
            raise SparkSemanticsError(f"EXTRACT({unit} ...) has no Spark-equal translation")
        return _cast(node, "INT")
    unit = _DATE_PARTS[type(node)]
    part = _cast(exp.Extract(this=exp.var(unit), expression=arg), "INT")
    return exp.Add(this=part, expression=exp.Literal.number(1)) if unit == "DOW" else part


def _days(node: exp.Expression) -> exp.Expression:
    """A DATE as its days since 1970-01-01 (INT)."""
    return exp.Anonymous(this="arrow_cast", expressions=[node, exp.Literal.string("Int32")])


def _shifted_date(
    date: exp.Expression, days: exp.Expression, subtract: bool = False
) -> exp.Expression:
    """The DATE ``days`` (an integer) after ``date``, or before with ``subtract``."""
    kind = exp.Sub if subtract else exp.Add
    total = kind(this=_days(date), expression=_cast(days, "INT"))
    return exp.Anonymous(this="arrow_cast", expressions=[total, exp.Literal.string("Date32")])


def _date_arg(t: _Translator, node: exp.Expression, what: str) -> exp.Expression:
    """``node`` as a DATE: a DATE, or an ISO date literal cast (Spark casts it the same)."""
    if _is_iso_date(node):
        return _cast(node, "DATE")
    at = t.type_of(node)
    if at is None or at.this != T.DATE:
        shown = at.sql("spark") if at is not None else "an unknown type"
        raise SparkSemanticsError(f"{what}() of {shown} has no Spark-equal translation here")
    return node


def _rule_date_add(t: _Translator, node: exp.TsOrDsAdd) -> exp.Expression:
    """``date_add(d, n)`` / ``date_sub(d, n)`` on a DATE: the day number plus ``n``."""
    unit = node.args.get("unit")
    if unit is not None and unit.name.upper() != "DAY":
        raise SparkSemanticsError(f"date_add by {unit.name} has no Spark-equal translation")
    days = node.expression
    dt = t.need(days, "date_add")
    if not st.is_integral(dt) or dt.this == T.BIGINT:
        raise SparkSemanticsError(f"date_add() by a {dt.sql('spark')}: Spark takes an INT")
    return _shifted_date(_date_arg(t, node.this, "date_add"), days)


def _rule_datediff(t: _Translator, node: exp.DateDiff) -> exp.Expression:
    """``datediff(end, start)`` of DATEs: days from ``start`` to ``end`` (INT)."""
    if node.args.get("unit") is not None:
        raise SparkSemanticsError("datediff() with a unit has no Spark-equal translation")
    end = _date_arg(t, node.this, "datediff")
    start = _date_arg(t, node.expression, "datediff")
    return exp.Paren(this=exp.Sub(this=_days(end), expression=_days(start)))


def _rule_date_format(t: _Translator, node: exp.TimeToStr) -> exp.Expression:
    """``date_format(d, pattern)`` of a DATE with a literal pattern: chrono's ``to_char``.

    Timestamps are formatted in the session time zone by Spark: they run on
    Spark SQL.
    """
    arg = node.this.this if isinstance(node.this, exp.TimeStrToTime) else node.this
    fmt = node.args.get("format")
    if not (isinstance(fmt, exp.Literal) and fmt.is_string):
        raise SparkSemanticsError("date_format() with a pattern that is not a literal")
    # sqlglot keeps the pattern in strftime letters; Spark's inverse mapping gives it back
    java = format_time(fmt.this, Spark.INVERSE_TIME_MAPPING, Spark.INVERSE_TIME_TRIE)
    chrono = to_chrono(java)
    return exp.Anonymous(
        this="to_char", expressions=[_date_arg(t, arg, "date_format"), exp.Literal.string(chrono)]
    )


def _rule_date_format_arg(t: _Translator, node: exp.TimeStrToTime) -> exp.Expression:
    # sqlglot wraps date_format's argument; _rule_date_format reads through it.
    if isinstance(node.parent, exp.TimeToStr) and node.arg_key == "this":
        return node
    raise SparkSemanticsError(_unsupported(node))


def _rule_interval(t: _Translator, node: exp.Interval) -> exp.Expression:
    """``INTERVAL n DAY[S] | MONTH[S] | YEAR[S]`` added to or subtracted from a DATE."""
    unit = node.unit.name.upper() if node.unit else ""
    singular = unit.removesuffix("S")
    if not isinstance(node.parent, exp.Add | exp.Sub) or singular not in ("DAY", "MONTH", "YEAR"):
        raise SparkSemanticsError(
            f"INTERVAL {unit} outside date +/- has no Spark-equal translation"
        )
    return exp.Interval(this=node.this, unit=exp.var(singular))


def _rule_grouping(t: _Translator, node: exp.Expression) -> exp.Expression:
    return _cast(node, "TINYINT")


RULES: dict[type, Callable[[_Translator, exp.Expression], exp.Expression]] = {
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
    exp.Round: _rule_round,
    exp.If: _rule_if_inside_case,
    exp.Case: _rule_branches,
    exp.Coalesce: _rule_branches,
    exp.Concat: _rule_concat,
    exp.RegexpLike: _rule_regexp_like,
    exp.Like: _rule_like,
    exp.Cast: _rule_cast,
    exp.TryCast: _rule_try_cast,
    exp.TsOrDsToDate: _rule_to_date,
    exp.Hint: lambda t, n: None,
    exp.JoinHint: lambda t, n: None,
    exp.Substring: _rule_substring,
    exp.Extract: _rule_date_part,
    **{c: _rule_date_part for c in _DATE_PARTS},
    exp.TsOrDsAdd: _rule_date_add,
    exp.DateDiff: _rule_datediff,
    exp.TimeToStr: _rule_date_format,
    exp.TimeStrToTime: _rule_date_format_arg,
    exp.Interval: _rule_interval,
    exp.Grouping: _rule_grouping,
    **{c: _rule_compare for c in _COMPARISONS},
}
"""Node class -> its rule: the node as it is, its Spark-equal rewrite, or
:class:`SparkSemanticsError`. Classes in ``_PASS`` pass unchanged; any other
class stops the translation."""
