"""Delta tables for the tests: written by deltalake, and deletion vectors written by hand.

deltalake 1.6 writes, appends, overwrites, deletes (by rewriting files: its
``DeltaTable.delete`` adds no deletion vector, even on a table with
``delta.enableDeletionVectors``) and column-mapped tables. Deletion vectors are
written by Delta Spark's ``DELETE``, which cannot run here (no Maven, so no
delta-spark jar). :func:`delete_rows_with_deletion_vector` therefore commits
what Delta Spark's ``DELETE`` commits, following the protocol's "Deletion
Vectors" section: a ``deletion_vector_<uuid>.bin`` file (format version 1:
size, magic number 1681511377, a portable 64-bit Roaring bitmap, CRC-32) and a
commit removing the file and adding it again with the vector's descriptor.
The result is checked by deltalake itself: the tests compare with its reads
(``DeltaTable.deletion_vectors()``, ``DeltaTable.scan()``), so a malformed
vector fails them rather than passing unnoticed.
"""

from __future__ import annotations

import json
import struct
import time
import uuid
import zlib
from pathlib import Path

import pyarrow as pa

Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
"""ZeroMQ's Z85 alphabet: how Delta names a deletion vector file by its UUID."""

MAGIC = 1681511377
"""The magic number at the start of a serialised deletion vector (little endian)."""


def z85(data: bytes) -> str:
    """Z85-encode ``data`` (a multiple of 4 bytes)."""
    out = []
    for i in range(0, len(data), 4):
        (n,) = struct.unpack(">I", data[i : i + 4])
        chunk = []
        for _ in range(5):
            n, r = divmod(n, 85)
            chunk.append(Z85[r])
        out.extend(reversed(chunk))
    return "".join(out)


def roaring_bitmap(values: list[int]) -> bytes:
    """The portable serialisation of a 32-bit Roaring bitmap of ``values`` (no run containers)."""
    by_key: dict[int, list[int]] = {}
    for v in sorted(set(values)):
        by_key.setdefault(v >> 16, []).append(v & 0xFFFF)
    keys = sorted(by_key)
    header = struct.pack("<II", 12346, len(keys))  # SERIAL_COOKIE_NO_RUNCONTAINER, containers
    descriptions = b"".join(struct.pack("<HH", k, len(by_key[k]) - 1) for k in keys)
    bodies = []
    for k in keys:
        low = by_key[k]
        if len(low) <= 4096:  # an array container
            bodies.append(struct.pack(f"<{len(low)}H", *low))
        else:  # a bitmap container: 65536 bits
            words = [0] * 1024
            for v in low:
                words[v >> 6] |= 1 << (v & 63)
            bodies.append(struct.pack("<1024Q", *words))
    offset = len(header) + len(descriptions) + 4 * len(keys)
    offsets = []
    for b in bodies:
        offsets.append(offset)
        offset += len(b)
    return header + descriptions + struct.pack(f"<{len(keys)}I", *offsets) + b"".join(bodies)


def deletion_vector(deleted: list[int]) -> bytes:
    """A serialised deletion vector: magic number, then a 64-bit Roaring bitmap (treemap)."""
    by_high: dict[int, list[int]] = {}
    for v in deleted:
        by_high.setdefault(v >> 32, []).append(v & 0xFFFFFFFF)
    out = struct.pack("<I", MAGIC) + struct.pack("<Q", len(by_high))
    for high in sorted(by_high):
        out += struct.pack("<I", high) + roaring_bitmap(by_high[high])
    return out


def _last_add(table: Path, path: str) -> dict:
    """The add action of data file ``path`` in the table's JSON log (the latest one)."""
    found = None
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action and action["add"]["path"] == path:
                found = action["add"]
            if "remove" in action and action["remove"]["path"] == path:
                found = None
    if found is None:
        msg = f"{path} is not an active file of {table}"
        raise ValueError(msg)
    return found


def delete_rows_with_deletion_vector(table: str | Path, path: str, rows: list[int]) -> int:
    """Delete rows ``rows`` (positions in the file) of data file ``path`` with a deletion vector.

    Args:
        table: a local Delta table whose protocol has the ``deletionVectors``
            feature (``configuration={"delta.enableDeletionVectors": "true"}``).
        path: the file's add path (as ``get_add_actions`` lists it).
        rows: 0-based positions in the file.

    Returns:
        The version committed.
    """
    table = Path(table)
    add = _last_add(table, path)
    data = deletion_vector(rows)
    file_id = uuid.uuid4()
    body = struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    (table / f"deletion_vector_{file_id}.bin").write_bytes(b"\x01" + body)
    versions = [int(p.stem) for p in (table / "_delta_log").glob("*.json")]
    version = max(versions) + 1
    now = int(time.time() * 1000)
    stats = json.loads(add.get("stats") or "{}")
    stats["tightBounds"] = False
    new_add = {
        **add,
        "modificationTime": now,
        "dataChange": True,
        "stats": json.dumps(stats),
        "deletionVector": {
            "storageType": "u",
            "pathOrInlineDv": z85(file_id.bytes),
            "offset": 1,
            "sizeInBytes": len(data),
            "cardinality": len(set(rows)),
        },
    }
    actions = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "DELETE",
                "operationParameters": {"predicate": "[]"},
                "readVersion": version - 1,
                "isBlindAppend": False,
            }
        },
        {
            "remove": {
                "path": path,
                "deletionTimestamp": now,
                "dataChange": True,
                "extendedFileMetadata": True,
                "partitionValues": add.get("partitionValues", {}),
                "size": add["size"],
                **({"deletionVector": add["deletionVector"]} if "deletionVector" in add else {}),
            }
        },
        {"add": new_add},
    ]
    log = table / "_delta_log" / f"{version:020d}.json"
    log.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    return version


def comparable(table: pa.Table) -> pa.Table:
    """``table`` with view and large string/binary types as plain ones (for comparing readers)."""
    fields = []
    for f in table.schema:
        fields.append(pa.field(f.name, _plain(f.type)))
    return table.cast(pa.schema(fields))


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(_plain(t.value_type))
    return t
