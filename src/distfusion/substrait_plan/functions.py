"""Native functions of datafusion-spark that translated Spark SQL calls by name.

A plan names a function and the context that decodes it must hold one of
that name: the coordinator's context of Spark's dialect registers these
(:func:`add_to`), and :func:`~distfusion.substrait_plan.decode.consume_plan`
registers those a plan names before decoding it, in every context (planning
and tasks, on any runtime). ``SessionContext.enable_spark_functions`` would
replace DataFusion's functions of the same names (``substring``, ...), so
only these are taken from it.
"""

from __future__ import annotations

import functools

from datafusion import SessionContext

__all__ = ["SPARK_FUNCTIONS", "add_to", "add_used"]

SPARK_FUNCTIONS = ("from_utc_timestamp",)
"""The functions: ``from_utc_timestamp(instant, zone)``, the wall time of an
instant in a zone (:mod:`distfusion.spark_sql.zones`)."""


@functools.cache
def _udfs() -> tuple:
    spark = SessionContext()
    spark.enable_spark_functions()
    return tuple(spark.udf(name) for name in SPARK_FUNCTIONS)


def add_to(ctx: SessionContext) -> None:
    """Register :data:`SPARK_FUNCTIONS` in ``ctx``."""
    for f in _udfs():
        ctx.register_udf(f)


def add_used(ctx: SessionContext, plan: bytes) -> None:
    """Register in ``ctx`` those of :data:`SPARK_FUNCTIONS` that serialized plan ``plan`` names."""
    for name, f in zip(SPARK_FUNCTIONS, _udfs(), strict=True):
        if name.encode() in plan:
            ctx.register_udf(f)
