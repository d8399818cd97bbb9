"""WorkUnit: a serialisable description of a piece of source data.

One concept for every source: a Parquet or CSV file known at planning time
(``path``, sizes from its footer), an in-memory batch (``ipc``), or a unit a
work unit feed discovers while the query runs (a file listed by a catalog, an
API page: ``path`` and/or an opaque ``data`` payload the table source's
``read`` understands). Units cross the network as bytes (:meth:`WorkUnit.to_bytes`,
JSON), never pickled.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

__all__ = ["WorkUnit"]


@dataclass(frozen=True)
class WorkUnit:
    """A serialisable piece of source data.

    Attributes:
        path: a file's path or URI (local path, ``s3://...``, any ``pyarrow.fs``
            or fsspec URI); ``""`` when the unit is not a file.
        size_bytes: bytes to scan when known (uncompressed size for Parquet,
            file size for CSV, buffer size for in-memory batches), else 0.
        num_rows: rows in the unit, or None when unknown.
        ipc: an Arrow IPC stream of the unit's rows (in-memory units only).
        data: an opaque payload for a user's feed-backed table source (a page
            token, a JSON request); for a Parquet file of a lakehouse table,
            how to read it (:class:`distfusion.io.sources.FileRead`: column
            names in the file, deleted rows); ``b""`` when unused.
        partition_values: a file of a directory-partitioned table
            (``.../dt=2024-01-01/region=EU/part-0.parquet``): the raw text of
            each partition column's directory value, in the table's
            ``partition_cols`` order (None: a Delta table's null partition);
            ``()`` otherwise.

    Example:
        >>> u = WorkUnit(path="/data/part-0.parquet", data=b"page=3")
        >>> WorkUnit.from_bytes(u.to_bytes()) == u
        True
    """

    path: str = ""
    size_bytes: int = 0
    num_rows: int | None = None
    ipc: bytes = b""
    data: bytes = b""
    partition_values: tuple[str | None, ...] = ()

    def to_json(self) -> dict:
        """The unit as JSON-able data (bytes fields as hex; ``data`` only when set)."""
        d = {
            "path": self.path,
            "size_bytes": self.size_bytes,
            "num_rows": self.num_rows,
            "ipc": self.ipc.hex(),
        }
        if self.data:
            d["data"] = base64.b64encode(self.data).decode()
        if self.partition_values:
            d["partition_values"] = list(self.partition_values)
        return d

    @classmethod
    def from_json(cls, d: dict) -> WorkUnit:
        """Inverse of :meth:`to_json`.

        Raises:
            KeyError: a required field is missing.
            ValueError: a bytes field is not valid hex or base64.
        """
        data = base64.b64decode(d["data"]) if d.get("data") else b""
        values = tuple(d.get("partition_values", ()))
        return cls(d["path"], d["size_bytes"], d["num_rows"], bytes.fromhex(d["ipc"]), data, values)

    def to_bytes(self) -> bytes:
        """The unit as UTF-8 JSON bytes: what a feed streams to a worker."""
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> WorkUnit:
        """Inverse of :meth:`to_bytes`.

        Raises:
            ValueError: ``raw`` is not a serialised work unit.
        """
        try:
            return cls.from_json(json.loads(raw))
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"not a serialised WorkUnit: {exc}"
            raise ValueError(msg) from exc
