"""When Spark is asked to encrypt, the Spark runtime's Flight data plane serves TLS only."""

from __future__ import annotations

import pytest

import distfusion.spark
from distfusion import DistributedConfig
from distfusion.errors import TransportError
from distfusion.protocol.task_plan import TaskKey
from distfusion.runtime.spark import SparkRuntime, encryption_settings
from distfusion.transport.flight import FlightWorkerTransport
from tests.compare import assert_same_result

# Shuffled joins and grouped aggregates over several tasks: outputs on executor workers.
SQL = """
SELECT o_orderpriority, count(*) AS n, sum(l_quantity) AS qty
FROM orders JOIN lineitem ON o_orderkey = l_orderkey
WHERE l_shipmode = 'MAIL'
GROUP BY o_orderpriority
"""
CONFIG = DistributedConfig(tasks_per_stage=2, broadcast_threshold_bytes=0)


def test_spark_settings_that_ask_for_encryption():
    assert encryption_settings({}) == []
    assert encryption_settings({"spark.network.crypto.enabled": "false"}) == []
    assert encryption_settings(
        {"spark.network.crypto.enabled": "true", "spark.io.encryption.enabled": "TRUE"}
    ) == ["spark.network.crypto.enabled", "spark.io.encryption.enabled"]
    assert encryption_settings({"spark.ssl.enabled": "true"}) == ["spark.ssl.enabled"]


def test_the_default_session_asks_for_nothing(spark):
    runtime = SparkRuntime(spark=spark)
    try:
        assert runtime.encryption == [] and runtime.tls is None
        assert runtime.transport.tls_root_certs is None
    finally:
        runtime.close()


@pytest.fixture
def encrypted(spark):
    """A Spark runtime on the test session, told that Spark encrypts its RPC."""
    runtime = SparkRuntime(spark=spark, conf={"spark.network.crypto.enabled": "true"})
    yield runtime
    runtime.close()


def test_encrypted_spark_serves_the_flight_plane_over_tls_only(spark, encrypted, oracle):
    assert encrypted.data_plane == "flight" and encrypted.tls is not None
    df = distfusion.spark.sql(spark, SQL, runtime=encrypted, config=CONFIG)
    assert "Flight over TLS (Spark encrypts: spark.network.crypto.enabled=true)" in df.explain()
    expected = oracle.sql(SQL).to_arrow_table()
    assert_same_result(df.to_arrow_table(), expected, ordered=False, check_types=False)

    # Hold the outputs on the executors' workers (as a Spark DataFrame reading them does).
    frame = df.to_spark()
    (query_id, run) = next(iter(encrypted.held_results.items()))
    placed = {
        key: url for key, url in run.placement.items() if url != run.runtime.driver_worker().url
    }
    assert placed, "some task ran on an executor's worker"
    (stage_id, task_index), url = next(iter(placed.items()))
    assert url.startswith("grpc+tls://")
    key = TaskKey(query_id, stage_id, task_index)

    # The runtime's own client (its certificate as the only root) reads partition 0.
    list(encrypted.transport.execute_partition(url, key, 0, timeout_s=10))

    plain = "grpc://" + url.removeprefix("grpc+tls://")
    for client, target in (
        (FlightWorkerTransport(token=encrypted.token), plain),  # no TLS at all
        (FlightWorkerTransport(token=encrypted.token), url),  # TLS, the system's roots
    ):
        try:
            with pytest.raises(TransportError):
                list(client.execute_partition(target, key, 0, timeout_s=10))
        finally:
            client.close()
    assert frame.count() == 5
