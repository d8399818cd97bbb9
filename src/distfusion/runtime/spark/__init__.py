"""The Spark runtime, driver side: Spark schedules and runs every task of a stage graph.

- :mod:`~distfusion.runtime.spark.runtime`: :class:`SparkRuntime`, the session
  and the executors' Flight workers as the driver sees them;
- :mod:`~distfusion.runtime.spark.config`: data planes, encryption, pyspark,
  the master URL;
- :mod:`~distfusion.runtime.spark.flight_plane` (default) and
  :mod:`~distfusion.runtime.spark.shuffle_plane`: one query's run on each data
  plane;
- :mod:`~distfusion.runtime.spark.dataframes`: Spark DataFrames read as tables;
- :mod:`~distfusion.runtime.spark.jobs`: Spark jobs' groups, names, progress
  and failures;
- :mod:`~distfusion.runtime.spark.connect` and
  :mod:`~distfusion.runtime.spark.connect_frames`: the runtime on a Spark
  Connect session, and its reading of Connect DataFrames.

What runs on the executors is in :mod:`distfusion.worker.spark_tasks` and
:mod:`distfusion.worker.spark_connect_tasks`.
"""

from distfusion.runtime.spark.config import (
    DATA_PLANES,
    ENCRYPTION_SETTINGS,
    encryption_settings,
    import_pyspark,
    is_connect_session,
    with_local_retries,
)
from distfusion.runtime.spark.connect import SparkConnectRuntime, connect_session
from distfusion.runtime.spark.dataframes import hold_dataframe, spark_arrow_schema, spark_scan
from distfusion.runtime.spark.jobs import job_group
from distfusion.runtime.spark.runtime import SparkRuntime
from distfusion.worker.spark_tasks import (
    EXECUTORS_SECTION,
    FAIL_TASK_PROPERTY,
    DataPlaneAccess,
    frame_function,
)

__all__ = [
    "DATA_PLANES",
    "ENCRYPTION_SETTINGS",
    "EXECUTORS_SECTION",
    "FAIL_TASK_PROPERTY",
    "DataPlaneAccess",
    "SparkConnectRuntime",
    "SparkRuntime",
    "connect_session",
    "encryption_settings",
    "frame_function",
    "hold_dataframe",
    "import_pyspark",
    "is_connect_session",
    "job_group",
    "spark_arrow_schema",
    "spark_scan",
    "with_local_retries",
]
