"""A read's pushed-down filter as plain predicates, for sources that prune their own units.

DataFusion pushes a query's filters into the table scan (the Substrait
``ReadRel.filter``, conjuncts over the read's base schema). This pass turns
each conjunct it can express into a :mod:`distfusion.work_unit_feed.filters`
predicate: comparisons of a column with a literal (either side), ``IN``
(DataFusion plans it as ``OR`` of equalities), ``IS [NOT] NULL``, and ``AND``,
``OR``, ``NOT`` of those. A conjunct with anything else (a function of a
column, two columns, ``LIKE``, a cast of the column, a subquery) is left out;
an ``OR`` with such a branch is left out whole, as is a ``NOT`` of one. The
result is therefore implied by the filter: a source may skip a unit none of
whose rows passes it (Iceberg's manifest and metrics evaluators, Delta's file
statistics) and no row the filter keeps is lost -- the filter itself still
runs in the tasks.
"""

from __future__ import annotations

import datetime
import decimal

from substrait.proto import Expression

from distfusion.substrait_plan.build import FunctionRegistry, conjuncts, is_field_ref
from distfusion.work_unit_feed.filters import And, Comparison, Filter, In, IsNull, Not, Or

__all__ = ["any_of", "filter_over_read", "literal_value", "scan_filters"]

_COMPARISONS = {"equal": "=", "not_equal": "!=", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}
_FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_EPOCH = datetime.date(1970, 1, 1)
_EPOCH_TS = datetime.datetime(1970, 1, 1)


def scan_filters(read, registry: FunctionRegistry) -> tuple[Filter, ...]:
    """The predicates implied by ``read``'s filter (a Substrait ``ReadRel``), a conjunction.

    Columns are named by ``read.base_schema``. ``filter`` and
    ``best_effort_filter`` both count (every row that reaches the tasks
    passes both).

    Returns:
        One predicate per expressible conjunct; ``()`` without a filter.
    """
    names = list(read.base_schema.names)
    out: list[Filter] = []
    for field in ("filter", "best_effort_filter"):
        if not read.HasField(field):
            continue
        for c in conjuncts(getattr(read, field), registry):
            f = _convert(c, registry, names)
            if f is not None:
                out.append(f)
    return tuple(out)


def filter_over_read(rel, registry: FunctionRegistry) -> tuple[str, tuple[Filter, ...]] | None:
    """``(table, predicates)`` of a ``FilterRel`` directly over a named-table read, else None.

    DataFusion keeps the filter above the scan of a table that takes no
    pushed-down filter (the coordinator's stand-in for a feed or a Spark
    table is an in-memory table): its condition reads the read's output
    columns (after the read's projection).
    """
    if rel.WhichOneof("rel_type") != "filter":
        return None
    child = rel.filter.input
    if (
        child.WhichOneof("rel_type") != "read"
        or child.read.WhichOneof("read_type") != "named_table"
    ):
        return None
    read = child.read
    names = list(read.base_schema.names)
    if read.HasField("projection"):
        names = [names[i.field] for i in read.projection.select.struct_items]
    found = [_convert(c, registry, names) for c in conjuncts(rel.filter.condition, registry)]
    return read.named_table.names[-1], tuple(f for f in found if f is not None)


def _convert(expr: Expression, registry: FunctionRegistry, names: list[str]) -> Filter | None:
    """``expr`` as a predicate, or None when any part of it is not expressible."""
    if expr.WhichOneof("rex_type") == "singular_or_list":
        return _in_list(expr.singular_or_list, names)
    if expr.WhichOneof("rex_type") != "scalar_function":
        return None
    fn = expr.scalar_function
    name = registry.name(fn.function_reference)
    args = [a.value for a in fn.arguments]
    if name in ("and", "or"):
        parts = [_convert(a, registry, names) for a in args]
        if any(p is None for p in parts):
            return None
        return And(tuple(parts)) if name == "and" else Or(tuple(parts))
    if name == "not" and len(args) == 1:
        inner = _convert(args[0], registry, names)
        return None if inner is None else Not(inner)
    if name in ("is_null", "is_not_null") and len(args) == 1:
        column = _column(args[0], names)
        return None if column is None else IsNull(column, name == "is_not_null")
    if name in _COMPARISONS and len(args) == 2:
        op = _COMPARISONS[name]
        left, right = _column(args[0], names), _column(args[1], names)
        if left is not None and right is None:
            value = literal_value(args[1])
            return None if value is None else Comparison(op, left, value)
        if right is not None and left is None:
            value = literal_value(args[0])
            return None if value is None else Comparison(_FLIPPED[op], right, value)
    return None


def _in_list(sol, names: list[str]) -> Filter | None:
    column = _column(sol.value, names)
    values = [literal_value(o) for o in sol.options]
    if column is None or any(v is None for v in values):
        return None
    return In(column, tuple(values))


def _column(expr: Expression, names: list[str]) -> str | None:
    index = is_field_ref(expr)
    if index is None or index >= len(names):
        return None
    return names[index]


def literal_value(expr: Expression):
    """The Python value of a Substrait literal expression; None for NULL or a kind not handled.

    Integers, floats, booleans, strings, dates (``datetime.date``), timestamps
    (naive ``datetime.datetime``: the stored instant or local time, as
    DataFusion's literal holds it) and decimals (``decimal.Decimal``).
    """
    if expr.WhichOneof("rex_type") != "literal":
        return None
    lit = expr.literal
    kind = lit.WhichOneof("literal_type")
    if kind in ("i8", "i16", "i32", "i64", "fp32", "fp64", "boolean"):
        return getattr(lit, kind)
    if kind in ("string", "var_char", "fixed_char"):
        value = getattr(lit, kind)
        return value if isinstance(value, str) else value.value
    if kind == "date":
        return _EPOCH + datetime.timedelta(days=lit.date)
    if kind == "timestamp":
        return _EPOCH_TS + datetime.timedelta(microseconds=lit.timestamp)
    if kind in ("precision_timestamp", "precision_timestamp_tz"):
        ts = getattr(lit, kind)
        micros = (
            ts.value * 10 ** (6 - ts.precision)
            if ts.precision <= 6
            else ts.value // 10 ** (ts.precision - 6)
        )
        if ts.precision > 6 and ts.value % 10 ** (ts.precision - 6):
            return None  # finer than a datetime holds: not exact, so not used
        return _EPOCH_TS + datetime.timedelta(microseconds=micros)
    if kind == "decimal":
        unscaled = int.from_bytes(lit.decimal.value, "little", signed=True)
        return decimal.Decimal(unscaled).scaleb(-lit.decimal.scale)
    return None


def any_of(reads: list[tuple[Filter, ...]]) -> tuple[Filter, ...]:
    """What several reads of one table imply together: a row any of them keeps passes it.

    Each element is one read's conjunction (:func:`scan_filters`); a read
    without a filter (``()``) keeps every row, so then nothing is implied.
    """
    if not reads or any(not r for r in reads):
        return ()
    distinct = list(dict.fromkeys(reads))
    if len(distinct) == 1:
        return distinct[0]
    return (Or(tuple(r[0] if len(r) == 1 else And(r) for r in distinct)),)
