"""Spark SQL's result types, for the arithmetic whose answer depends on them.

DataFusion and Spark agree on the values of most expressions, but not on the
types of number literals, of ``/`` and of decimal arithmetic, and the types
decide the values (a scale is a rounding). These rules are Spark's, from
``org.apache.spark.sql.catalyst.analysis.DecimalPrecision`` and
``DecimalType.adjustPrecisionScale`` (Spark 3.4-4.x):

- ``+ -``: scale ``max(s1, s2)``, precision ``max(p1-s1, p2-s2) + scale + 1``;
- ``*``: precision ``p1 + p2 + 1``, scale ``s1 + s2``;
- ``/``: scale ``max(6, s1 + p2 + 1)``, precision ``p1 - s1 + s2 + scale``;
- past 38 digits, with ``spark.sql.decimalOperations.allowPrecisionLoss``
  (the default): the integer digits are kept and the scale shrinks, to no
  less than ``min(scale, 6)``;
- an integer operand is the decimal of its type (INT: ``decimal(10,0)``), an
  integer *literal* the decimal of its digits (``1``: ``decimal(1,0)``,
  ``spark.sql.legacy.literal.pickMinimumPrecision``);
- ``sum``: ``decimal(p+10, s)``; ``avg``: ``decimal(p+4, s+4)`` (bounded at 38).

Types are sqlglot ``DataType`` objects, the way the translator sees a query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

import pyarrow as pa
from sqlglot import exp

__all__ = [
    "MAX_PRECISION",
    "Decimal",
    "arrow_to_sql_type",
    "decimal_of",
    "is_integral",
    "is_decimal",
    "is_fractional",
    "divide_type",
    "add_type",
    "multiply_type",
    "wider_integral",
]

MAX_PRECISION = 38
MIN_ADJUSTED_SCALE = 6  # DecimalType.MINIMUM_ADJUSTED_SCALE

T = exp.DataType.Type
_INTEGRAL = {T.TINYINT: 3, T.SMALLINT: 5, T.INT: 10, T.BIGINT: 20}
_RANK = [T.TINYINT, T.SMALLINT, T.INT, T.BIGINT]
_FRACTIONAL = {T.FLOAT, T.DOUBLE}


@dataclass(frozen=True)
class Decimal:
    """A decimal type: ``precision`` digits, ``scale`` of them after the point."""

    precision: int
    scale: int

    def sql_type(self) -> exp.DataType:
        """As a sqlglot type."""
        return exp.DataType.build(f"DECIMAL({self.precision}, {self.scale})")


def is_integral(t: exp.DataType | None) -> TypeGuard[exp.DataType]:
    """TINYINT, SMALLINT, INT or BIGINT."""
    return t is not None and t.this in _INTEGRAL


def is_fractional(t: exp.DataType | None) -> TypeGuard[exp.DataType]:
    """FLOAT or DOUBLE."""
    return t is not None and t.this in _FRACTIONAL


def is_decimal(t: exp.DataType | None) -> TypeGuard[exp.DataType]:
    """A DECIMAL with known precision and scale."""
    return t is not None and t.this == T.DECIMAL and decimal_of(t) is not None


def decimal_of(t: exp.DataType, literal: exp.Literal | None = None) -> Decimal | None:
    """``t`` as Spark's decimal: itself, or an integer type's (or integer literal's) decimal.

    Returns:
        None for another type or a decimal without precision and scale.
    """
    if literal is not None and is_integral(t):
        digits = len(literal.this.lstrip("-").lstrip("0")) or 1
        return Decimal(digits, 0)
    if t.this in _INTEGRAL:
        return Decimal(_INTEGRAL[t.this], 0)
    if t.this != T.DECIMAL:
        return None
    params = t.expressions
    if len(params) != 2:
        return None
    return Decimal(int(params[0].this.this), int(params[1].this.this))


def known_decimal(t: exp.DataType) -> Decimal:
    """:func:`decimal_of` ``t``, a type :func:`is_decimal` or :func:`is_integral` accepts.

    Raises:
        ValueError: ``t`` is neither (the caller's mistake).
    """
    d = decimal_of(t)
    if d is None:
        raise ValueError(f"{t.sql('spark')} is not a decimal of known precision and scale")
    return d


def _adjust(precision: int, scale: int) -> Decimal:
    """``DecimalType.adjustPrecisionScale`` with precision loss allowed (Spark's default)."""
    if precision <= MAX_PRECISION:
        return Decimal(precision, scale)
    int_digits = precision - scale
    min_scale = min(scale, MIN_ADJUSTED_SCALE)
    return Decimal(MAX_PRECISION, max(MAX_PRECISION - int_digits, min_scale))


def add_type(a: Decimal, b: Decimal) -> Decimal:
    """Spark's type of ``a + b`` and ``a - b``."""
    scale = max(a.scale, b.scale)
    return _adjust(max(a.precision - a.scale, b.precision - b.scale) + scale + 1, scale)


def multiply_type(a: Decimal, b: Decimal) -> Decimal:
    """Spark's type of ``a * b``."""
    return _adjust(a.precision + b.precision + 1, a.scale + b.scale)


def divide_type(a: Decimal, b: Decimal) -> Decimal:
    """Spark's type of ``a / b``."""
    scale = max(MIN_ADJUSTED_SCALE, a.scale + b.precision + 1)
    return _adjust(a.precision - a.scale + b.scale + scale, scale)


def sum_type(a: Decimal) -> Decimal:
    """Spark's type of ``sum`` over ``a``."""
    return Decimal(min(MAX_PRECISION, a.precision + 10), a.scale)


def avg_type(a: Decimal) -> Decimal:
    """Spark's type of ``avg`` over ``a``."""
    return Decimal(min(MAX_PRECISION, a.precision + 4), min(MAX_PRECISION, a.scale + 4))


def round_type(a: Decimal, digits: int) -> Decimal:
    """Spark's type of ``round(a, digits)`` for ``digits >= 0``."""
    scale = min(digits, a.scale)
    return Decimal(min(MAX_PRECISION, a.precision - a.scale + 1 + scale), scale)


def wider_integral(a: exp.DataType, b: exp.DataType) -> exp.DataType:
    """The wider of two integral types (Spark's result type of ``+ - *`` on them)."""
    return a if _RANK.index(a.this) >= _RANK.index(b.this) else b


_ARROW = [
    (pa.types.is_int8, "TINYINT"),
    (pa.types.is_int16, "SMALLINT"),
    (pa.types.is_int32, "INT"),
    (pa.types.is_int64, "BIGINT"),
    (pa.types.is_float32, "FLOAT"),
    (pa.types.is_float64, "DOUBLE"),
    (pa.types.is_boolean, "BOOLEAN"),
    (pa.types.is_date32, "DATE"),
    (pa.types.is_string, "STRING"),
    (pa.types.is_large_string, "STRING"),
    (pa.types.is_string_view, "STRING"),
    (pa.types.is_binary, "BINARY"),
    (pa.types.is_large_binary, "BINARY"),
    (pa.types.is_binary_view, "BINARY"),
]


def arrow_to_sql_type(t: pa.DataType) -> str:
    """The Spark SQL type name of Arrow type ``t`` (``UNKNOWN`` for a type without one here).

    A column of an unknown type can still be read and compared; an
    expression whose result type depends on it is not translated.
    """
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz else "TIMESTAMP_NTZ"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        element = arrow_to_sql_type(t.value_type)
        return "UNKNOWN" if element == "UNKNOWN" else f"ARRAY<{element}>"
    if pa.types.is_struct(t):
        fields = [(f.name, arrow_to_sql_type(f.type)) for f in t]
        if not fields or any(kind == "UNKNOWN" for _, kind in fields):
            return "UNKNOWN"
        quoted = ("`" + name.replace("`", "``") + "`" for name, _ in fields)
        return (
            "STRUCT<"
            + ", ".join(f"{q}: {kind}" for q, (_, kind) in zip(quoted, fields, strict=True))
            + ">"
        )
    if pa.types.is_map(t):
        key, item = arrow_to_sql_type(t.key_type), arrow_to_sql_type(t.item_type)
        return "UNKNOWN" if "UNKNOWN" in (key, item) else f"MAP<{key}, {item}>"
    for test, name in _ARROW:
        if test(t):
            return name
    return "UNKNOWN"
