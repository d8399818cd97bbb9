"""The Spark runtime's configuration: data planes, encryption, pyspark, the master URL.

What :class:`~distfusion.runtime.spark.runtime.SparkRuntime` settles when it
starts: the data plane (:data:`DATA_PLANES`), whether Spark's settings ask for
encryption (then the Flight data plane serves TLS too), whether pyspark is
installed, whether the session is a Spark Connect one, and local-mode retries.

``pyspark`` is an optional dependency: it is imported inside the functions
that need it (each marked so).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping

DATA_PLANES = ("flight", "shuffle")
"""Values of ``SparkRuntime(data_plane=...)``."""

ENCRYPTION_SETTINGS = (
    "spark.network.crypto.enabled",
    "spark.authenticate.enableSaslEncryption",
    "spark.io.encryption.enabled",
    "spark.ssl.enabled",
    "spark.ssl.rpc.enabled",
)
"""Spark settings that ask for encryption: with any of them ``true``, the
Flight data plane serves TLS too (:func:`encryption_settings`). Spark's RPC
(AES-based, or SASL), its shuffle and spill files, and TLS for all or for RPC
(Spark's security page). Files: distfusion's own spill files stay
unencrypted (docs/memory.md)."""


def encryption_settings(settings: Mapping[str, str | None]) -> list[str]:
    """The :data:`ENCRYPTION_SETTINGS` that are ``true`` in ``settings`` (Spark's conf)."""
    return [k for k in ENCRYPTION_SETTINGS if str(settings.get(k, "")).strip().lower() == "true"]


_LOCAL_MASTER = re.compile(r"^local\[(\d+|\*)\]$")


def import_pyspark():
    """Import and return the ``pyspark`` package.

    Raises:
        ImportError: pyspark is not installed; says what to install.
    """
    try:  # optional dependency
        import pyspark
        import pyspark.sql  # noqa: F401
    except ImportError as exc:
        msg = (
            "the Spark runtime needs pyspark: pip install 'distfusion[spark]' "
            "(or pip install pyspark), or use LocalRuntime()"
        )
        raise ImportError(msg) from exc
    return pyspark


def is_connect_session(spark) -> bool:
    """Whether ``spark`` is a Spark Connect session (``SparkSession.builder.remote(...)``).

    Checked without importing pyspark's Connect client (its extras may be missing).
    """
    return type(spark).__module__.startswith("pyspark.sql.connect")


def with_local_retries(master: str, task_max_failures: int) -> str:
    """``local[N]`` -> ``local[N,F]``: Spark's local mode retries a task only when F > 1."""
    m = _LOCAL_MASTER.match(master.replace(" ", ""))
    if m is None or task_max_failures <= 1:
        return master
    return f"local[{m.group(1)},{task_max_failures}]"


def same_interpreter(python: str, executable: str) -> bool:
    """Whether command ``python`` (a path, or a name on the ``PATH``) starts ``executable``."""
    found = shutil.which(python)  # not resolved further: a venv's python links to its base
    return found is not None and os.path.abspath(found) == os.path.abspath(executable)
