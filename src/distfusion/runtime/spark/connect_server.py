"""Spark Connect's service inside a classic SparkSession's application, for tests and benchmarks.

A deployment runs its Connect server on its own (``start-connect-server.sh``,
Databricks). Here the service is started in the JVM of a classic session
(:func:`start_connect_server`), so a Spark Connect session and the classic one
share one Spark application, its executors and task slots: the tests run
both kinds of session on the same resources, and start one JVM, not two. The
Connect client talks to it over gRPC on 127.0.0.1 as it would to any server;
nothing of distfusion's Connect runtime uses the classic session.
"""

from __future__ import annotations

__all__ = ["start_connect_server"]


def start_connect_server(spark) -> str:
    """Start Spark Connect's gRPC service in classic session ``spark``'s application.

    It listens on 127.0.0.1, on a free port, until the application stops.
    Starting it again returns the running service's URL.

    Args:
        spark: a classic ``pyspark.sql.SparkSession`` (Spark 4, whose jars
            include ``spark-connect``).

    Returns:
        The URL a Connect client connects to: ``sc://127.0.0.1:PORT``.

    Raises:
        Exception: the JVM has no Spark Connect service (py4j's error).
    """
    sc = spark.sparkContext
    package = sc._jvm.org.apache.spark.sql.connect.service
    service = getattr(getattr(package, "SparkConnectService$"), "MODULE$")
    if not service.started():
        conf = sc._jsc.sc().conf()  # the application's own: the service reads it when it starts
        conf.set("spark.connect.grpc.binding.address", "127.0.0.1")
        conf.set("spark.connect.grpc.binding.port", "0")
        service.start(sc._jsc.sc())
    return f"sc://127.0.0.1:{service.localPort()}"
