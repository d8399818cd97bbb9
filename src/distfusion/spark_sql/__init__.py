"""Spark SQL with Spark's semantics on DataFusion: the PySpark drop-in's dialect.

:func:`translate` turns one Spark SQL query into DataFusion SQL that answers
what Spark answers, or raises :class:`~distfusion.errors.SparkSemanticsError`
naming what it cannot translate; :data:`RULES` is the table of what it knows
(docs/spark.md, "Spark SQL, with Spark's answers"). ``DistributedConfig(sql_dialect="spark")``
plans every ``sql()`` of a context this way; ``distfusion.spark.sql`` does,
and hands what cannot be translated to Spark SQL itself.
"""

from distfusion.spark_sql.translate import (
    PARSER_SETTINGS,
    RULES,
    SparkSettings,
    parse,
    table_names,
    translate,
)

__all__ = ["PARSER_SETTINGS", "RULES", "SparkSettings", "parse", "table_names", "translate"]
