"""Spark DataFrames read as tables: held on the driver, read by Spark as Arrow batches.

A leaf stage reading a Spark DataFrame (:func:`~distfusion.io.sources.spark_source`)
starts from the DataFrame itself rather than from ``parallelize``: its RDD is
the DataFrame coalesced to the stage's task count and converted to Arrow by
Spark in each partition (``Dataset.toArrowBatchRdd``, what ``toArrow()``
collects, here left distributed), and task *i* runs in the Spark task that
computes partition *i*, fed that partition's batches
(:mod:`distfusion.worker.spark_partitions`). Spark's readers, pushdowns and
shuffles compute the DataFrame; nothing of it reaches the driver. On either
data plane the task's output then goes where every other task's goes::

    DataFrame.coalesce(n) -> toArrowBatchRdd (Spark)  partition i: Arrow batches
      .mapPartitionsWithIndex(run task i, fed partition i)  -> output as any task's

When Spark makes fewer partitions than the stage has tasks (an adaptive
shuffle coalesced), the tasks past them run over an empty partition.
"""

from __future__ import annotations

import uuid
import weakref

import pyarrow as pa

from distfusion.coordinator.checks import first_line
from distfusion.errors import (
    PlanningError,
)
from distfusion.runtime.spark.connect_frames import is_connect_dataframe, statistics
from distfusion.stages import SourceScan, Stage

_DATAFRAMES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
"""Spark DataFrames read as tables, by id (driver side; weak: the context holds them)."""


def hold_dataframe(df) -> str:
    """An id for Spark DataFrame ``df``, under which the Spark runtime finds it to read it.

    Only a weak reference is kept here: whoever registered ``df`` as a table
    (a :class:`~distfusion.context.DistributedContext`) keeps it alive.
    """
    dataframe_id = uuid.uuid4().hex
    _DATAFRAMES[dataframe_id] = df
    return dataframe_id


def held_dataframe(dataframe_id: str, table: str):
    """The DataFrame :func:`hold_dataframe` gave ``dataframe_id``.

    Raises:
        PlanningError: it is gone (its context was closed or collected).
    """
    df = _DATAFRAMES.get(dataframe_id)
    if df is None:
        msg = (
            f"table {table!r}: its Spark DataFrame is no longer held (the context that "
            "registered it is gone); plan the query again"
        )
        raise PlanningError(msg)
    return df


def spark_scan(stage: Stage) -> SourceScan | None:
    """The Spark DataFrame ``stage`` reads, if any (the planner allows one per stage)."""
    return next((scan for scan in stage.scans if scan.source.is_spark), None)


def spark_input(sc, stage: Stage, scan: SourceScan):
    """The DataFrame of ``scan`` as an RDD of Arrow batches, at most ``stage.num_tasks`` partitions.

    Only the columns the query reads (the scan's ``columns``) are selected;
    then ``DataFrame.coalesce(n)`` (no shuffle; fewer partitions stay as they are)
    then Spark's own Arrow conversion in each partition
    (``Dataset.toArrowBatchRdd``, batches of
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, time stamps in
    ``spark.sql.session.timeZone``). An adaptive plan runs its shuffles now.

    Returns:
        ``(rdd, partitions, read_schema)``: each record of ``rdd`` one Arrow
        IPC record batch message; ``read_schema`` the Arrow schema Spark wrote
        them with.

    Raises:
        PlanningError: the DataFrame is gone, or Spark cannot convert it to Arrow.
    """
    from pyspark.rdd import RDD  # optional dependency
    from pyspark.serializers import NoOpSerializer  # optional dependency

    table = scan.source.name
    df = held_dataframe(scan.source.options["dataframe_id"], table)
    if df.sparkSession.sparkContext is not sc:
        msg = f"table {table!r}: its Spark DataFrame belongs to another SparkSession"
        raise PlanningError(msg)
    cols = scan.source.options.get("columns")
    if cols is not None:  # only what the query reads: Spark prunes the rest at its source
        from pyspark.sql import functions as F  # optional dependency

        names = df.columns
        df = df.select(*[F.col("`" + names[i].replace("`", "``") + "`") for i in cols])
    conf = df.sparkSession.conf
    time_zone = conf.get("spark.sql.session.timeZone")
    max_records = int(conf.get("spark.sql.execution.arrow.maxRecordsPerBatch", "10000"))
    try:
        read_schema = spark_arrow_schema(df.schema, time_zone)
        # The JVM Dataset's Arrow batches (what toArrow() collects): no public PySpark API.
        jrdd = df.coalesce(stage.num_tasks)._jdf.toArrowBatchRdd(  # noqa: SLF001
            max_records, time_zone, False, False
        )
    except Exception as exc:
        msg = f"table {table!r}: Spark cannot read it as Arrow batches: {first_line(exc)}"
        raise PlanningError(msg) from exc
    rdd = RDD(jrdd.toJavaRDD(), sc, NoOpSerializer())
    return rdd, rdd.getNumPartitions(), read_schema


def spark_arrow_schema(struct, time_zone: str) -> pa.Schema:
    """Spark schema ``struct`` as Arrow types, as Spark's Arrow conversion writes them.

    PySpark's ``to_arrow_schema``: ``TimestampType`` -> ``timestamp[us, tz=time_zone]``,
    ``TimestampNTZType`` -> ``timestamp[us]``, ``StringType`` -> ``string``
    (not large), decimals, dates, nested types as Arrow's.

    Raises:
        Exception: a type Arrow cannot express (PySpark's error).
    """
    from pyspark.sql.pandas.types import to_arrow_schema  # optional dependency

    return to_arrow_schema(struct, timezone=time_zone, prefers_large_types=False)


def spark_statistics(df) -> tuple[int | None, int | None, int | None]:
    """``(partitions, sizeInBytes, rowCount)`` Spark knows of ``df`` without running it.

    Partitions: of the physical plan's RDD; for an adaptive plan (its
    partitions are known once its shuffles ran) the partitioning it plans
    before running, an upper bound (Spark may coalesce them). Sizes: the
    optimized plan's statistics; Spark's default for unknown
    (``Long.MaxValue``) is None. A Spark Connect DataFrame: its explanation's
    (:func:`~distfusion.runtime.spark.connect_frames.statistics`).
    """
    if is_connect_dataframe(df):
        return statistics(df)
    qe = df._jdf.queryExecution()  # noqa: SLF001 - PySpark has no public query execution
    partitions = size = rows = None
    try:
        plan = qe.executedPlan()
        if plan.getClass().getSimpleName() != "AdaptiveSparkPlanExec":
            partitions = int(plan.execute().getNumPartitions())
        else:
            partitions = int(plan.inputPlan().outputPartitioning().numPartitions()) or None
    except Exception:  # Spark's: the runtime finds out when it runs
        partitions = None
    try:
        stats = qe.optimizedPlan().stats()
        size = int(str(stats.sizeInBytes()))  # a BigInt, or an int from py4j
        if size >= 2**62:
            size = None
        if stats.rowCount().isDefined():
            rows = int(str(stats.rowCount().get()))
    except Exception:  # Spark's: no estimate
        pass
    return partitions, size, rows
