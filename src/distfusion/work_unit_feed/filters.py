"""What a read's filter says about its columns, as plain predicates for sources that prune.

A source that decides its own work units (an Iceberg scan walking manifests, a
Delta log's file statistics, a user's API feed) can skip units no row of which
passes the query's filter. The planner turns a read's pushed-down filter
(DataFusion's ``TableScan`` filters, the Substrait ``ReadRel.filter``) into
these predicates (:func:`distfusion.planner.scan_filters.scan_filters`): a
conjunction, each conjunct one of::

    Comparison(op, column, value)   op in = != < <= > >=
    In(column, values)
    IsNull(column, negated)
    And(children)  Or(children)  Not(child)

Values are Python scalars: ``int``, ``float``, ``str``, ``bool``,
``datetime.date``, ``datetime.datetime`` (naive: the column's own time, or UTC
for a zoned column), ``decimal.Decimal``. A conjunct the planner cannot express
(a function of a column, a comparison of two columns, ``LIKE``) is left out,
so the predicates are *implied by* the filter: a unit they rule out holds no
row the filter keeps. Pruning with them only ever skips rows the filter drops,
and every filter still runs in the tasks.

A feed-backed table gets them per read as
:attr:`~distfusion.work_unit_feed.feed.FeedContext.filters`. They travel in
task plans and source options as JSON (:func:`to_json`, :func:`from_json`).
"""

from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass
from typing import Any

__all__ = [
    "And",
    "Comparison",
    "Filter",
    "In",
    "IsNull",
    "Not",
    "OPS",
    "Or",
    "from_json",
    "to_json",
]

OPS = ("=", "!=", "<", "<=", ">", ">=")
"""The comparison operators of :class:`Comparison`."""


@dataclass(frozen=True)
class Comparison:
    """``column op value``: true where the column compares so with ``value``; never for NULL."""

    op: str
    column: str
    value: Any


@dataclass(frozen=True)
class In:
    """``column IN values``: true where the column equals one of ``values``."""

    column: str
    values: tuple


@dataclass(frozen=True)
class IsNull:
    """``column IS NULL`` (``negated``: ``IS NOT NULL``)."""

    column: str
    negated: bool = False


@dataclass(frozen=True)
class And:
    """All of ``children``."""

    children: tuple


@dataclass(frozen=True)
class Or:
    """Any of ``children``."""

    children: tuple


@dataclass(frozen=True)
class Not:
    """Not ``child`` (SQL's: NOT of unknown is unknown)."""

    child: Any


Filter = Comparison | In | IsNull | And | Or | Not
"""One predicate."""


def _value_to_json(v: Any) -> Any:
    if isinstance(v, bool | int | float | str) or v is None:
        return v
    if isinstance(v, datetime.datetime):
        return {"datetime": v.isoformat()}
    if isinstance(v, datetime.date):
        return {"date": v.isoformat()}
    if isinstance(v, decimal.Decimal):
        return {"decimal": str(v)}
    msg = f"not a filter value: {v!r}"
    raise TypeError(msg)


def _value_from_json(v: Any) -> Any:
    if isinstance(v, dict):
        if "datetime" in v:
            return datetime.datetime.fromisoformat(v["datetime"])
        if "date" in v:
            return datetime.date.fromisoformat(v["date"])
        if "decimal" in v:
            return decimal.Decimal(v["decimal"])
        msg = f"not a filter value: {v!r}"
        raise ValueError(msg)
    return v


def _one_to_json(f: Filter) -> list:
    if isinstance(f, Comparison):
        return [f.op, f.column, _value_to_json(f.value)]
    if isinstance(f, In):
        return ["in", f.column, [_value_to_json(v) for v in f.values]]
    if isinstance(f, IsNull):
        return ["is_not_null" if f.negated else "is_null", f.column]
    if isinstance(f, And | Or):
        return ["and" if isinstance(f, And) else "or", *[_one_to_json(c) for c in f.children]]
    if isinstance(f, Not):
        return ["not", _one_to_json(f.child)]
    msg = f"not a filter: {f!r}"
    raise TypeError(msg)


def _one_from_json(d: list) -> Filter:
    op = d[0]
    if op in OPS:
        return Comparison(op, str(d[1]), _value_from_json(d[2]))
    if op == "in":
        return In(str(d[1]), tuple(_value_from_json(v) for v in d[2]))
    if op in ("is_null", "is_not_null"):
        return IsNull(str(d[1]), op == "is_not_null")
    if op in ("and", "or"):
        children = tuple(_one_from_json(c) for c in d[1:])
        return And(children) if op == "and" else Or(children)
    if op == "not":
        return Not(_one_from_json(d[1]))
    msg = f"unknown filter operator {op!r}"
    raise ValueError(msg)


def to_json(filters: tuple[Filter, ...]) -> list:
    """``filters`` (a conjunction) as JSON-able lists (``["<", "a", 5]``, ``["and", ...]``).

    Raises:
        TypeError: an element is not a filter, or holds a value of another type.
    """
    return [_one_to_json(f) for f in filters]


def from_json(data: list) -> tuple[Filter, ...]:
    """Inverse of :func:`to_json`.

    Raises:
        ValueError: ``data`` is not a list of encoded filters.
    """
    try:
        return tuple(_one_from_json(d) for d in data)
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        msg = f"not a list of filters: {exc}"
        raise ValueError(msg) from exc
