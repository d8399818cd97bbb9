"""The object store of an Iceberg table's files, from its pyiceberg FileIO properties.

The tasks read data files through DataFusion's object stores
(:mod:`distfusion.io.object_store`). A table on a bucket with no store
registered gets one made from the properties its catalog gave pyiceberg's
FileIO (``s3.endpoint``, ``s3.region``, ``s3.access-key-id``, ...; the
``client.*`` keys as fallbacks), as pyiceberg itself would connect; keys
given there travel to the workers as any explicit store credentials do (an
authenticated channel only, never in plans, ``explain()`` or errors). A store
registered before (``ctx.register_object_store``) is used as it is.
"""

from __future__ import annotations

from urllib.parse import urlparse

from distfusion.io import object_store

__all__ = ["ensure_store", "store_from_properties"]

_S3_SCHEMES = ("s3", "s3a", "s3n")


def store_from_properties(url: str, properties: dict[str, str]):
    """The DataFusion store for ``url`` made from pyiceberg FileIO ``properties`` (None: local).

    Args:
        url: a file or directory URL of the table (``s3://bucket/warehouse/t``).
        properties: the table's ``FileIO.properties``.

    Returns:
        An :class:`~distfusion.io.object_store.AmazonS3` for ``s3://``/``s3a://``
        (endpoint, region, keys and session token as the properties give them,
        ``allow_http`` for an ``http://`` endpoint; what is not given each
        worker takes from its environment); a
        :class:`~distfusion.io.object_store.GoogleCloud` for ``gs://``; a
        :class:`~distfusion.io.object_store.MicrosoftAzure` for ``abfs[s]://``
        (account from the URL or ``adls.account-name``, key from
        ``adls.account-key``); None for a local path or ``file://``.

    Raises:
        ValueError: ``url``'s scheme has no object store (e.g. ``hdfs://``).
    """
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        return None
    p = properties

    def first(*keys: str) -> str | None:
        for k in keys:
            if p.get(k):
                return p[k]
        return None

    if scheme in _S3_SCHEMES:
        endpoint = first("s3.endpoint")
        return object_store.AmazonS3(
            bucket_name=parsed.netloc,
            region=first("s3.region", "client.region"),
            access_key_id=first("s3.access-key-id", "client.access-key-id"),
            secret_access_key=first("s3.secret-access-key", "client.secret-access-key"),
            session_token=first("s3.session-token", "client.session-token"),
            endpoint=endpoint,
            allow_http=bool(endpoint and endpoint.startswith("http://")),
        )
    if scheme in ("gs", "gcs"):
        return object_store.GoogleCloud(bucket_name=parsed.netloc)
    if scheme in ("abfs", "abfss", "az", "azure"):
        container, _, rest = parsed.netloc.partition("@")
        account = rest.split(".", 1)[0] if rest else first("adls.account-name")
        return object_store.MicrosoftAzure(
            container_name=container, account=account, access_key=first("adls.account-key")
        )
    msg = f"no object store reads {scheme}:// URLs ({url}); DataFusion reads s3, gs, az, abfs(s)"
    raise ValueError(msg)


def ensure_store(url: str, properties: dict[str, str]) -> str | None:
    """Register the store of ``url`` from ``properties`` unless one is registered; its key.

    Returns:
        ``scheme://bucket`` of the store serving ``url`` (registered now or
        before), or None for a local path.

    Raises:
        ValueError: see :func:`store_from_properties`.
    """
    if not object_store.is_url(url):
        if urlparse(url).scheme.lower() not in ("", "file"):
            store_from_properties(url, properties)  # raises: no store for the scheme
        return None
    key = object_store.store_url(url)
    if key in object_store.registered():
        return key
    store = store_from_properties(url, properties)
    if store is None:
        return None
    scheme, _, host = key.partition("://")
    return object_store.register(scheme, store, host)
