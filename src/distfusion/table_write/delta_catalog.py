"""A directory of Delta tables, mounted as a catalog: ``root/<namespace>/<table>/_delta_log``.

:class:`DeltaDirectoryCatalog` is what
:meth:`~distfusion.context.DistributedContext.register_catalog` takes for Delta
Lake: Spark's warehouse layout without a metastore (a namespace is a
directory, as a Spark database is a directory of the warehouse; a table is
a Delta table root below it). Tables are found by path, loaded by delta-rs
when a query names them; only ``SHOW TABLES`` and the error for a missing
table list the directory.
"""

from __future__ import annotations

import os
from typing import Any

from distfusion.io import delta, object_store

__all__ = ["DeltaDirectoryCatalog"]


class DeltaDirectoryCatalog:
    """The Delta tables below ``root``: table ``ns.t`` is the Delta table at ``root/ns/t``.

    Mounted with ``ctx.register_catalog("lake", DeltaDirectoryCatalog(root))``,
    ``lake.ns.t`` in SQL reads (and ``INSERT INTO`` / ``MERGE INTO`` /
    ``CREATE TABLE ... AS`` write) the Delta table at ``root/ns/t``.

    Args:
        root: a local directory or an object store URL (``s3://bucket/lake``).
        storage_options: delta-rs's storage options for the tables (default:
            made from the store registered for the bucket).

    Example:
        >>> import tempfile
        >>> DeltaDirectoryCatalog(tempfile.mkdtemp()).list_namespaces()
        []
    """

    def __init__(
        self, root: str | os.PathLike, storage_options: dict[str, str] | None = None
    ) -> None:
        root = os.fspath(root)
        if root.startswith("file://"):
            root = root[len("file://") :]
        self.root = root.rstrip("/") if object_store.is_url(root) else os.path.abspath(root)
        self.storage_options = storage_options

    def __repr__(self) -> str:
        return f"DeltaDirectoryCatalog({self.root!r})"

    def table_uri(self, namespace: str, table: str) -> str:
        """Where table ``namespace.table`` is (or would be created): ``root/namespace/table``."""
        if object_store.is_url(self.root):
            return f"{self.root}/{namespace}/{table}"
        return os.path.join(self.root, namespace, table)

    def options_for(self, uri: str) -> dict[str, str] | None:
        """delta-rs's storage options for the table at ``uri`` (None on local disk)."""
        if not object_store.is_url(uri):
            return None
        if self.storage_options is not None:
            return {**delta.COORDINATOR_STORAGE_OPTIONS, **self.storage_options}
        return delta.storage_options_for(uri)

    def load_table(self, namespace: str, table: str) -> Any | None:
        """The ``deltalake.DeltaTable`` of ``namespace.table`` at its latest version; None if none.

        Raises:
            ImportError: deltalake is not installed.
            Exception: delta-rs's error for a log it cannot read.
        """
        dl = delta.import_deltalake()
        uri = self.table_uri(namespace, table)
        try:
            return dl.DeltaTable(uri, storage_options=self.options_for(uri))
        except dl.exceptions.TableNotFoundError:
            return None

    def list_namespaces(self) -> list[str]:
        """The directories below ``root``, sorted (hidden ones and ``_``-prefixed left out)."""
        return sorted({ns for ns, _ in self._tables(namespaces_only=True)})

    def list_tables(self, namespace: str) -> list[str]:
        """The Delta tables of ``namespace`` (directories holding ``_delta_log``), sorted."""
        return sorted(t for ns, t in self._tables(namespace=namespace) if ns == namespace and t)

    def _tables(
        self, namespace: str | None = None, namespaces_only: bool = False
    ) -> list[tuple[str, str]]:
        """``(namespace, table)`` below root; ``(namespace, "")`` for a namespace directory."""
        if object_store.is_url(self.root):
            base = self.root + ("/" + namespace if namespace else "")
            try:
                keys = object_store.list_prefix(base)
            except OSError:
                return []
            out = set()
            for key in keys:
                rel = key[len(self.root) + 1 :].split("/")
                if len(rel) >= 2 and not rel[0].startswith(("_", ".")):
                    out.add((rel[0], ""))
                    if len(rel) >= 4 and rel[2] == "_delta_log":
                        out.add((rel[0], rel[1]))
            return sorted(out)
        listed: list[tuple[str, str]] = []
        if not os.path.isdir(self.root):
            return listed
        for ns in os.listdir(self.root):
            path = os.path.join(self.root, ns)
            if ns.startswith(("_", ".")) or not os.path.isdir(path):
                continue
            if namespace is not None and ns != namespace:
                continue
            listed.append((ns, ""))
            if namespaces_only:
                continue
            for t in os.listdir(path):
                if os.path.isdir(os.path.join(path, t, "_delta_log")):
                    listed.append((ns, t))
        return listed
