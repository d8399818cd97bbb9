"""Where DataFusion reads the files of Spark's tables: local paths and object store URLs.

Spark names its files with Hadoop URIs (``file:``, ``s3a://``, ``gs://``, ...);
DataFusion reads local paths and object store URLs through the stores of
:mod:`distfusion.io.object_store`. An ``s3a://`` bucket's store is made from
Spark's own ``fs.s3a.*`` Hadoop settings, so the same credentials serve both.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

from distfusion.io import object_store
from distfusion.io.object_store import store_url
from distfusion.runtime.spark.config import is_connect_session

__all__ = ["native_path", "s3_store_from_hadoop"]

_S3_SCHEMES = ("s3", "s3a", "s3n")


def native_path(spark, uri: str) -> str | None:
    """Where DataFusion reads Spark's file ``uri``: a local path or an object store URL.

    ``s3a://`` (and ``s3n://``) URIs become ``s3://`` URLs read through an
    ``AmazonS3`` store made, unless one is registered for the bucket, from
    Spark's Hadoop configuration (:func:`s3_store_from_hadoop`); ``gs://`` and
    ``abfs[s]://`` through stores from the environment. None: another scheme
    (HDFS, ...), read through Spark; on Spark Connect also a local path this
    client does not see (the server's file system is not the client's).
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        path = unquote(parsed.path)
        if is_connect_session(spark) and not os.path.exists(path):
            return None
        return path
    if scheme in _S3_SCHEMES:
        url = "s3://" + uri.split("://", 1)[1]
        if store_url(url) not in object_store.registered():
            object_store.register(
                "s3://", s3_store_from_hadoop(spark, parsed.netloc), parsed.netloc
            )
        return url
    if object_store.is_url(uri):
        return uri
    return None


_HADOOP_S3 = (
    ("endpoint", "endpoint"),
    ("access.key", "access_key_id"),
    ("secret.key", "secret_access_key"),
    ("session.token", "session_token"),
    ("endpoint.region", "region"),
)


def s3_store_from_hadoop(spark, bucket: str) -> object_store.AmazonS3:
    """An ``AmazonS3`` store for ``bucket`` from Spark's ``fs.s3a.*`` Hadoop settings.

    Per-bucket settings (``fs.s3a.bucket.<bucket>.endpoint``, ...) win over
    the global ones, as in Hadoop's S3A. Keys set there travel to the
    executors in Spark's task closures; without them each executor takes
    credentials from its environment. ``fs.s3a.connection.ssl.enabled=false``
    or an ``http://`` endpoint allows plain HTTP. A Spark Connect session has
    no Hadoop configuration to read: its ``spark.hadoop.fs.s3a.*`` settings
    are read instead, where the server exposes them (it hides keys and
    secrets from a client: the executors' environment provides those).
    """
    if is_connect_session(spark):

        def setting(key: str):
            try:
                return spark.conf.get(f"spark.hadoop.{key}", None)
            except Exception:  # the server does not expose it
                return None

    else:
        # pyspark exposes no Hadoop configuration: the JVM context's
        setting = spark.sparkContext._jsc.hadoopConfiguration().get  # noqa: SLF001

    def get(key: str) -> str | None:
        value = setting(f"fs.s3a.bucket.{bucket}.{key}") or setting(f"fs.s3a.{key}")
        return str(value) if value else None

    args = {arg: value for key, arg in _HADOOP_S3 if (value := get(key))}
    endpoint = args.get("endpoint")
    if endpoint and "://" not in endpoint:
        ssl = (get("connection.ssl.enabled") or "true").lower() != "false"
        args["endpoint"] = ("https://" if ssl else "http://") + endpoint
    allow_http = args.get("endpoint", "").startswith("http://")
    return object_store.AmazonS3(bucket_name=bucket, allow_http=allow_http, **args)
