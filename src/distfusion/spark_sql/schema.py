"""Spark's analysis of a query as the drop-in's schema contract.

``distfusion.spark.sql`` asks Spark for the output schema of a query (analyzed,
never run) and casts the translated result to it where no value changes.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from datafusion import col

from distfusion.errors import SparkSemanticsError

__all__ = ["as_spark_schema", "plan_type", "same_values", "spark_schema"]


def spark_schema(spark, query: str):
    """Spark's analysis of ``query``: its output ``StructType``, or None when Spark rejects it.

    Spark only analyzes ``SELECT * FROM (query)``: a query is planned and
    not run; DDL, DML or several statements fail to parse there instead of
    being executed (``spark.sql`` runs commands at once).
    """
    text = query.strip().rstrip(";").strip()
    if not text:
        return None
    try:  # on their own lines: a trailing ``--`` comment must not hide the parenthesis
        return spark.sql(f"SELECT * FROM (\n{text}\n)").schema
    except Exception:  # Spark's parse or analysis error
        return None


def same_values(got: pa.DataType, spark: pa.DataType) -> bool:
    """Whether a column of type ``got`` cast to Spark's type ``spark`` keeps every value.

    Equal types; strings (view, large, plain); integers (a value out of
    Spark's range fails the cast, as Spark's ANSI mode fails the query);
    decimals of one scale; timestamps of one time zone; lists, structs (the
    same field names) and maps of such.
    """
    if got == spark:
        return True
    strings = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    binaries = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
    for kind in (strings, binaries, (pa.types.is_integer,)):
        if any(test(got) for test in kind) and any(test(spark) for test in kind):
            return True
    if pa.types.is_decimal(got) and pa.types.is_decimal(spark):
        return got.scale == spark.scale
    if pa.types.is_timestamp(got) and pa.types.is_timestamp(spark):
        return (got.tz is None) == (spark.tz is None)
    if _is_list(got) and _is_list(spark):
        return same_values(got.value_type, spark.value_type)
    if pa.types.is_struct(got) and pa.types.is_struct(spark):  # fields by position, named alike
        return got.num_fields == spark.num_fields and all(
            g.name == s.name and same_values(g.type, s.type)
            for g, s in zip(got, spark, strict=True)
        )
    if pa.types.is_map(got) and pa.types.is_map(spark):
        return same_values(got.key_type, spark.key_type) and same_values(
            got.item_type, spark.item_type
        )
    return False


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)


def as_spark_schema(df: Any, expected: pa.Schema) -> Any:
    """``df`` (a DistributedDataFrame) with Spark's column names and types (``expected``).

    A name Spark repeats (``SELECT a.x, b.x``) is made distinct with a
    ``#<position>`` suffix, as DataFusion's projections need distinct names:
    :func:`spark_names` gives the names to show.

    Raises:
        SparkSemanticsError: the column counts differ, or a type differs so
            that the values would (:func:`same_values`).
    """
    got = df.schema()
    if len(got) != len(expected):
        msg = f"the translation gives {len(got)} columns where Spark gives {len(expected)}"
        raise SparkSemanticsError(msg)
    columns: list[Any] = []  # datafusion Exprs
    seen: set[str] = set()
    qualified = _qualified_names(df, got)
    for have, want in zip(got, expected, strict=True):
        if not same_values(have.type, want.type):
            msg = (
                f"column {want.name!r}: distfusion computes {have.type} where Spark gives "
                f"{want.type}"
            )
            raise SparkSemanticsError(msg)
        name = want.name if want.name not in seen else f"{want.name}#{len(columns)}"
        seen.add(name)
        column, to = col(qualified[len(columns)]), plan_type(have.type, want.type)
        # Cast even to the same type: the distributed plan may widen what the logical plan
        # types (a decimal sum over partial sums); not a struct or map, whose names it loses.
        same_nested = to == have.type and _has_struct_or_map(to)
        columns.append((column if same_nested else column.cast(to)).alias(name))
    return df.select(*columns)


def _has_struct_or_map(t: pa.DataType) -> bool:
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return True
    return _is_list(t) and _has_struct_or_map(t.value_type)


def plan_type(got: pa.DataType, spark: pa.DataType) -> pa.DataType:
    """The type a column of type ``got`` is cast to in the plan, to give Spark's ``spark``.

    Spark's type, except a timestamp's zone (Substrait carries no zone but
    UTC), the name of a list's element (Substrait carries none) and structs
    and maps (a struct's field names do not survive Substrait as a cast's
    type): the plan keeps its own, and the result is relabeled with Spark's,
    the same values
    (:class:`distfusion.spark.SparkDataFrame`).
    """
    if pa.types.is_timestamp(got) and pa.types.is_timestamp(spark) and got.tz and spark.tz:
        return pa.timestamp(spark.unit, got.tz)
    if _is_list(got) and _is_list(spark):  # the element's name and nullability: at the result
        return pa.list_(plan_type(got.value_type, spark.value_type))
    if pa.types.is_struct(got) or pa.types.is_map(got):  # at the result: a Substrait cast
        return got  # to a struct loses its field names (the consumer names them c0, c1, ...)
    return spark


def _qualified_names(df: Any, got: pa.Schema) -> list[str]:
    """Each output column's reference: its name, or ``"q"."name"`` where the name repeats.

    ``SELECT a.x, b.x`` has two columns ``x``, told apart by their qualifiers
    (DataFusion's schema of the plan).
    """
    names = got.names
    if len(set(names)) == len(names):
        return names
    plan_names = df.df.logical_plan().to_variant().schema().field_names()
    out = []
    for name, full in zip(names, plan_names, strict=True):
        qualifier = full[: -len(name) - 1] if full.endswith("." + name) else ""
        if names.count(name) == 1 or not qualifier:
            out.append(name)
        else:
            parts = [*qualifier.split("."), name]
            out.append(".".join('"' + p.replace('"', '""') + '"' for p in parts))
    return out
