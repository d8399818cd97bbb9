"""Rules for arrays: Spark's array functions as DataFusion's, with Spark's answers.

``collect_list``, ``collect_set``, ``sort_array``, ``size``, ``array(...)``,
``explode`` and ``posexplode``.

Differences each rule covers (checked against Spark in tests/spark_sql_cases.py):

- ``collect_list`` / ``collect_set`` skip NULLs and give ``[]`` for a group
  without a value; DataFusion's ``array_agg`` keeps NULLs and gives NULL.
  The order of the elements is not defined in either engine (Spark's
  documentation calls both functions non-deterministic).
- ``sort_array``: NULLs first ascending, last descending.
- ``size`` of a NULL array: NULL with ANSI mode, -1 without (Spark's
  ``spark.sql.legacy.sizeOfNull``); DataFusion's ``cardinality`` is NULL.
- ``explode`` in a select list: a row per element, none for a NULL or empty
  array, as DataFusion's ``unnest``. ``LATERAL VIEW explode(...)`` over one
  table becomes such a select list in a subquery
  (:func:`without_generators`); ``LATERAL VIEW OUTER`` unnests a one-NULL
  array in place of a NULL or empty one (one row with a NULL, as Spark).
- ``posexplode``: two such unnests in one select list, of the array and of
  its positions (``range``, cast to INT), which DataFusion zips row by row
  (:func:`without_generators`); ``_outer`` and ``LATERAL VIEW OUTER`` give
  one row of NULLs for a NULL or empty array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard, TypeVar

from sqlglot import exp

from distfusion.errors import SparkSemanticsError
from distfusion.spark_sql import types as st
from distfusion.spark_sql.nodes import T, Translation, cast_to, unsupported

__all__ = ["COLLECTION_RULES", "without_generators"]

_ARROW_NAMES = {
    T.TINYINT: "Int8",
    T.SMALLINT: "Int16",
    T.INT: "Int32",
    T.BIGINT: "Int64",
    T.FLOAT: "Float32",
    T.DOUBLE: "Float64",
    T.BOOLEAN: "Boolean",
    T.VARCHAR: "Utf8",
    T.TEXT: "Utf8",
    T.DATE: "Date32",
}

Q = TypeVar("Q", bound=exp.Expr)  # without_generators gives back what it is given


def _arrow_name(t: exp.DataType, what: str) -> str:
    """DataFusion's name of the Arrow type of Spark type ``t`` (for ``arrow_cast``)."""
    if st.is_decimal(t):
        d = st.known_decimal(t)
        return f"Decimal128({d.precision}, {d.scale})"
    name = _ARROW_NAMES.get(t.this)
    if name is None:
        raise SparkSemanticsError(f"{what}() of a {t.sql('spark')}: not translated")
    return name


def _is_array(t: exp.DataType | None) -> TypeGuard[exp.DataType]:
    return t is not None and t.this == T.ARRAY


def _fn(name: str, *args: exp.Expr) -> exp.Anonymous:
    return exp.Anonymous(this=name, expressions=list(args))


def _rule_collect(t: Translation, node: exp.Expr) -> exp.Expr:
    """``collect_list(x)`` / ``collect_set(x)``: ``array_agg`` of the non-NULL values, or ``[]``."""
    what = "collect_set" if isinstance(node, exp.ArrayUniqueAgg) else "collect_list"
    if isinstance(node.parent, exp.Window):
        raise SparkSemanticsError(f"{what}() over a window: not translated")
    arg = node.this
    elem = _arrow_name(t.need(arg, what), what)
    inner = exp.Distinct(expressions=[arg]) if what == "collect_set" else arg
    present = exp.Not(this=exp.Is(this=arg.copy(), expression=exp.Null()))
    filtered = exp.Filter(this=_fn("array_agg", inner), expression=exp.Where(this=present))
    empty = _fn("arrow_cast", _fn("make_array"), exp.Literal.string(f"List({elem})"))
    return exp.Coalesce(this=filtered, expressions=[empty])


def _rule_sort_array(t: Translation, node: exp.ArraySort) -> exp.Expr:
    """``sort_array(a[, asc])``: NULLs first ascending, last descending (Spark's order)."""
    asc = node.args.get("asc")
    if asc is not None and not isinstance(asc, exp.Boolean):
        raise SparkSemanticsError("sort_array() with an order that is not TRUE or FALSE")
    ascending = asc is None or asc.this
    order = "ASC" if ascending else "DESC"
    nulls = "NULLS FIRST" if ascending else "NULLS LAST"
    return _fn("array_sort", node.this, exp.Literal.string(order), exp.Literal.string(nulls))


def _rule_size(t: Translation, node: exp.ArraySize) -> exp.Expr:
    """``size(a)`` of an array (INT): NULL for a NULL array with ANSI mode, else -1."""
    if not _is_array(t.type_of(node.this)):
        raise SparkSemanticsError(f"{unsupported(node)} of anything but an array")
    size = cast_to(_fn("cardinality", node.this), "INT")
    if t.settings.ansi:
        return size
    return exp.Coalesce(this=size, expressions=[exp.Literal.number(-1)])


def _rule_array(t: Translation, node: exp.Array) -> exp.Expr:
    """``array(a, b, ...)``: its elements cast to Spark's common type."""
    if not node.expressions:
        raise SparkSemanticsError("array() without elements: not translated")
    common = t.common_type(node.expressions)
    if common is None:
        raise SparkSemanticsError("array() of elements without a common type here")
    _arrow_name(common, "array")  # a type make_array builds as Spark does
    return _fn("make_array", *(cast_to(e, common) for e in node.expressions))


def _rule_explode(t: Translation, node: exp.Explode) -> exp.Expr:
    """``explode(a)`` as an item of a select list: ``unnest(a)``, the column ``col``.

    The node :func:`without_generators` marks ``positions`` unnests ``a``'s
    0-based positions instead (INT), ``outer`` a one-NULL array for a NULL
    or empty one.
    """
    parent = node.parent
    in_select = isinstance(parent, exp.Select) or (
        isinstance(parent, exp.Alias) and isinstance(parent.parent, exp.Select)
    )
    array = t.type_of(node.this)
    if not in_select or node.expressions or not _is_array(array):
        raise SparkSemanticsError("explode() other than of an array in a select list")
    arg = node.this
    element = array.expressions[0] if array.expressions else None
    if node.meta.get("positions"):
        count = cast_to(_fn("cardinality", arg.copy()), "BIGINT")
        span = _fn("range", exp.Literal.number(0), count)
        arg = _fn("arrow_cast", span, exp.Literal.string("List(Int32)"))
        element = exp.DataType.build("INT")
    if node.meta.get("outer"):  # a NULL row for a NULL or empty array
        if element is None:
            raise SparkSemanticsError("an outer explode of an array of unknown elements")
        _arrow_name(element, "explode")
        has_rows = exp.GT(
            this=_fn("cardinality", node.this.copy()), expression=exp.Literal.number(0)
        )
        nulls = _fn("make_array", cast_to(exp.Null(), element))
        arg = exp.Case(ifs=[exp.If(this=has_rows, true=arg)], default=nulls)
    unnest = _fn("unnest", arg)
    return unnest if isinstance(parent, exp.Alias) else exp.Alias(this=unnest, alias="col")


def _generated(gen: exp.Expr, names: list[str], outer: bool) -> list[exp.Expr]:
    """The select items of generator ``gen`` (``explode`` or ``posexplode``) named ``names``.

    Raises:
        SparkSemanticsError: another generator, or a count of names unlike its columns.
    """
    positions = isinstance(gen, exp.Posexplode)
    known = type(gen) is exp.Explode or isinstance(gen, (exp.ExplodeOuter, exp.Posexplode))
    if not known or gen.expressions:
        raise SparkSemanticsError(f"generator {gen.sql('spark')[:60]!r}: not translated")
    defaults = ["pos", "col"] if positions else ["col"]
    if names and len(names) != len(defaults):
        msg = f"{gen.sql('spark')[:60]!r} makes {len(defaults)} columns, named {len(names)}"
        raise SparkSemanticsError(msg)
    outer = outer or isinstance(gen, exp.ExplodeOuter)
    items = []
    for i, name in enumerate(names or defaults):
        node = exp.Explode(this=gen.this.copy())
        node.meta["outer"] = outer
        node.meta["positions"] = positions and i == 0
        items.append(exp.alias_(node, name))
    return items


def without_generators(ast: Q) -> Q:
    """``ast`` with generators as explodes of one column each, lateral views as subqueries.

    ``posexplode(a) [AS (p, c)]`` in a select list becomes two items, its
    positions' and its elements' explodes (:func:`_generated`); a
    ``FROM t [AS a] LATERAL VIEW [OUTER] gen(e) v AS x`` becomes
    ``FROM (SELECT *, <gen's items> FROM t AS a) AS a``, one level per lateral
    view in order; ``v.x`` becomes ``a.x``. The same rows and columns (Spark's
    ``SELECT *`` lists the table's columns, then the generated ones).

    Raises:
        SparkSemanticsError: a generator DataFusion cannot compute so:
            another generator than ``explode`` and ``posexplode`` of one
            argument, a name count unlike its column count, a ``FROM`` with
            joins beside a lateral view.
    """
    for select in list(ast.find_all(exp.Select)):
        for item in list(select.expressions):
            gen = item.this if isinstance(item, exp.Aliases) else item
            if isinstance(gen, (exp.Posexplode, exp.ExplodeOuter)) or (
                isinstance(item, exp.Aliases) and isinstance(gen, exp.Explode)
            ):
                names = [i.name for i in item.expressions] if isinstance(item, exp.Aliases) else []
                at = select.expressions.index(item)
                items = _generated(gen, names, outer=False)
                select.set(
                    "expressions", [*select.expressions[:at], *items, *select.expressions[at + 1 :]]
                )
        laterals = select.args.get("laterals") or []
        if not laterals:
            continue
        source = select.args.get("from_") or select.args.get("from")
        table = source.this if source is not None else None
        if select.args.get("joins") or not isinstance(table, exp.Table):
            raise SparkSemanticsError("LATERAL VIEW beside a join or a subquery: not translated")
        alias = table.alias_or_name
        views = {lateral.alias.lower() for lateral in laterals if lateral.alias}
        for column in select.find_all(exp.Column):  # the laterals' own arguments too
            if column.table.lower() in views:
                column.set("table", exp.to_identifier(alias))
        for lateral in laterals:
            names = lateral.args["alias"].columns if lateral.args.get("alias") else []
            items = _generated(
                lateral.this, [n.name for n in names], bool(lateral.args.get("outer"))
            )
            inner = exp.select(exp.Star(), *items).from_(table)
            table = exp.alias_(exp.Subquery(this=inner), alias, table=True)
        select.set("laterals", None)
        select.set("from_" if "from_" in select.args else "from", exp.From(this=table))
    return ast


def _rule_concat_ws(t: Translation, node: exp.ConcatWs) -> exp.Expr:
    """``concat_ws(sep, s, ...)`` of strings (Spark also joins arrays' elements: not translated)."""
    for e in node.expressions:
        et = t.type_of(e)
        if et is None or et.this not in (T.VARCHAR, T.TEXT, T.CHAR):
            raise SparkSemanticsError("concat_ws() of anything but strings: not translated")
    return node


COLLECTION_RULES: dict[type[exp.Expr], Callable[[Translation, Any], exp.Expr]] = {
    exp.ArrayAgg: _rule_collect,
    exp.ArrayUniqueAgg: _rule_collect,
    exp.ArraySort: _rule_sort_array,
    exp.ArraySize: _rule_size,
    exp.Array: _rule_array,
    exp.Explode: _rule_explode,
    exp.ConcatWs: _rule_concat_ws,
}
"""The node classes of arrays -> their rules (part of ``translate.RULES``)."""
