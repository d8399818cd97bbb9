"""A query's pushed-down filters as a pyiceberg expression, for scan planning.

The planner gives a feed-backed table's read its filters as plain predicates
(:mod:`distfusion.work_unit_feed.filters`: ``Comparison``, ``In``, ``IsNull``,
``And``, ``Or``, ``Not``; a tuple of conjuncts in ``FeedContext.filters``).
pyiceberg's evaluators (partition projection, manifest summaries, column
min/max) then skip the data files no row of which can pass. Pruning must
only ever skip what the filter itself would drop, so a predicate is
converted only where pyiceberg's meaning is (at least) as inclusive as
DataFusion's; everything else is left out (every filter still runs in the
tasks):

- a conjunct that cannot be converted is dropped (the rest prunes less);
  inside ``Or`` every branch must convert, each one possibly weakened the
  same way; inside ``Not`` only exact conversions count (weakening under a
  negation would strengthen the whole);
- a value converts only to a column of the same kind: ``int`` to an
  ``int``/``long`` column (``int`` within 32 bits), ``str`` to ``string``,
  ``bool`` to ``boolean``, ``date`` to ``date``, ``Decimal`` to a
  ``decimal`` of the same scale or wider (exactly representable), a naive
  ``datetime`` to ``timestamp`` or ``timestamptz`` (then UTC, as the planner
  gives it), an aware one to ``timestamptz``. A value of
  another kind (a float compared with an int column: ``x < 2.5`` is not
  ``x < 2``) is dropped rather than cast;
- ``double`` columns only for ``=`` and ``IN`` with numbers that are not
  NaN (their negations, ``!=`` and ``NOT IN``, never skip a file): DataFusion
  compares floats in IEEE total order (NaN above every number, -NaN below),
  while Iceberg's bounds leave NaN out, so a range on them could skip a file
  whose NaN rows DataFusion keeps; ``float`` columns not at all (a double
  literal rounded to float).
"""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Any

from distfusion.work_unit_feed.filters import And, Comparison, In, IsNull, Not, Or

__all__ = ["to_iceberg_expression"]

_OPS = ("=", "!=", "<", "<=", ">", ">=")


def to_iceberg_expression(filters: tuple, schema) -> Any:
    """The conjunction of ``filters`` as a pyiceberg ``BooleanExpression`` over ``schema``.

    Args:
        filters: the conjuncts of ``FeedContext.filters`` (empty: no filter).
        schema: the pyiceberg ``Schema`` the table is read with (columns by
            their top-level names, case-sensitive).

    Returns:
        The expression (``AlwaysTrue()`` when nothing converts).
    """
    from pyiceberg import expressions as ex  # optional dependency

    parts = [e for e in (_convert(f, schema, exact=False) for f in filters) if e is not None]
    if not parts:
        return ex.AlwaysTrue()
    out = parts[0]
    for p in parts[1:]:
        out = ex.And(out, p)
    return out


def _convert(f, schema, exact: bool):
    """``f`` as a pyiceberg expression, or None; ``exact``: no weakening allowed (under Not)."""
    from pyiceberg import expressions as ex  # optional dependency

    if isinstance(f, And):
        parts = [_convert(c, schema, exact) for c in f.children]
        if exact and any(p is None for p in parts):
            return None
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        out = parts[0]
        for p in parts[1:]:
            out = ex.And(out, p)
        return out
    if isinstance(f, Or):
        parts = [_convert(c, schema, exact) for c in f.children]
        if not parts or any(p is None for p in parts):
            return None
        out = parts[0]
        for p in parts[1:]:
            out = ex.Or(out, p)
        return out
    if isinstance(f, Not):
        inner = _convert(f.child, schema, exact=True)
        return None if inner is None else ex.Not(inner)
    if isinstance(f, IsNull):
        if _field(schema, f.column) is None:
            return None
        return ex.NotNull(f.column) if f.negated else ex.IsNull(f.column)  # type: ignore[call-arg, arg-type]  # pyiceberg takes a column name; mypy reads its pydantic fields
    if isinstance(f, Comparison):
        return _comparison(f.op, f.column, f.value, schema)
    if isinstance(f, In):
        return _in(f.column, f.values, schema)
    return None


def _comparison(op: str, column: str, value: Any, schema):
    from pyiceberg import expressions as ex  # optional dependency

    field = _field(schema, column)
    if op not in _OPS or field is None:
        return None
    literal = _literal(field.field_type, value, op)
    if literal is None:
        return None
    make = {
        "=": ex.EqualTo,
        "!=": ex.NotEqualTo,
        "<": ex.LessThan,
        "<=": ex.LessThanOrEqual,
        ">": ex.GreaterThan,
        ">=": ex.GreaterThanOrEqual,
    }[op]
    return make(column, literal)


def _in(column: str, values, schema):
    from pyiceberg import expressions as ex  # optional dependency

    field = _field(schema, column)
    values = list(values)
    if field is None or not values:
        return None
    literals = [_literal(field.field_type, v, "=") for v in values]
    if any(v is None for v in literals):
        return None
    return ex.In(column, literals)  # type: ignore[call-arg, arg-type]  # pyiceberg takes a column name; mypy reads its pydantic fields


def _field(schema, column: str):
    """The top-level field ``column`` of ``schema``, or None."""
    for f in schema.fields:
        if f.name == column:
            return f
    return None


def _literal(t, value: Any, op: str) -> Any:
    """``value`` as a literal of Iceberg type ``t`` if of its kind (see the module), else None."""
    from pyiceberg import types as it  # optional dependency

    if value is None:
        return None
    if isinstance(value, bool):
        return value if isinstance(t, it.BooleanType) else None
    if isinstance(value, int):
        if isinstance(t, it.LongType) and -(2**63) <= value < 2**63:
            return value
        if isinstance(t, it.IntegerType) and -(2**31) <= value < 2**31:
            return value
        return None
    if isinstance(value, float):
        if isinstance(t, it.DoubleType) and op == "=" and not math.isnan(value):
            return value
        return None
    if isinstance(value, str):
        return value if isinstance(t, it.StringType) else None
    if isinstance(value, decimal.Decimal):
        if not isinstance(t, it.DecimalType) or not value.is_finite():
            return None
        quantum = decimal.Decimal(1).scaleb(-t.scale)
        try:
            exact = value.quantize(quantum, context=decimal.Context(prec=t.precision + 1))
        except decimal.InvalidOperation:
            return None
        return exact if exact == value else None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None and isinstance(t, it.TimestampType | it.TimestamptzType):
            return value  # naive: the column's own time (UTC for a zoned one), as pyiceberg's
        if value.tzinfo is not None and isinstance(t, it.TimestamptzType):
            return value
        return None
    if isinstance(value, datetime.date):
        return value if isinstance(t, it.DateType) else None
    return None
