"""The DataFrame API: DataFusion's transformations, distributed when an action runs.

A :class:`~distfusion.context.DistributedDataFrame` wraps a DataFusion
``DataFrame`` built on the coordinator's ``SessionContext``
(``DistributedContext.ctx``). Each transformation of :class:`Transformations`
is DataFusion's own, applied to that DataFrame: it builds a new logical plan on
the coordinator (checked there: an unknown column fails at once, with
DataFusion's message) and returns a new distributed DataFrame around it.
Nothing runs until an action (``collect``, ``to_arrow_table``, ``count``,
``write_parquet``, ...): then the optimized plan goes through Substrait and
the distributed planner, as a SQL query does::

    from datafusion import col, lit, functions as F
    from distfusion import DistributedContext, LocalRuntime

    ctx = DistributedContext(runtime=LocalRuntime(workers=4))
    lineitem = ctx.read_parquet("data/tpch-sf1/lineitem/")
    df = (
        lineitem.filter(col("l_quantity") > lit(45))
        .aggregate([col("l_returnflag")], [F.sum(col("l_extendedprice")).alias("total")])
        .sort(col("l_returnflag"))
    )
    df.explain()                  # the stages, as for ctx.sql(...)
    df.to_arrow_table()

Expressions are DataFusion's (``datafusion.col``, ``lit``,
``datafusion.functions``, window functions included), and the names and
signatures are those of datafusion-python 55's ``DataFrame``, so code written
for DataFusion runs distributed by changing where its first DataFrame comes
from. :class:`Readers` gives :class:`~distfusion.context.DistributedContext`
those first DataFrames: ``table``, ``read_parquet``, ``read_csv``,
``read_json``, ``from_arrow``, ``from_pydict``, ``from_pylist``,
``from_pandas`` and ``from_datafusion`` (and ``register_view``).

The package: ``transformations.py`` (:class:`Transformations`, also the
plan accessors and the actions built on a run: ``describe``, ``to_polars``,
``__arrow_c_stream__``, ...), ``readers.py`` (:class:`Readers`),
``actions.py`` (what those actions do with a distributed result, with
DataFusion's own code: ``describe``'s statistics, ``repr``'s text, the Arrow
stream export) and ``sessions.py`` (which ``SessionContext`` a DataFrame
belongs to).

A DataFrame built on another ``SessionContext`` reads tables this context
does not know, so it is refused (:func:`check_session`). The coordinator's
context carries a marker function, registered when the
:class:`~distfusion.context.DistributedContext` is made
(:func:`mark_session`); DataFusion copies a context's functions into every
DataFrame made on it, so a DataFrame that cannot resolve the marker was made
elsewhere. docs/dataframe.md has the details.
"""

from distfusion.dataframe.readers import Readers
from distfusion.dataframe.sessions import check_session, mark_session, plan_label
from distfusion.dataframe.transformations import Transformations

__all__ = ["Readers", "Transformations", "check_session", "mark_session", "plan_label"]
