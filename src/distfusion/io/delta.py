"""Delta Lake tables as file sources, described by their own log through delta-rs.

``DistributedContext.register_delta(name, table)`` loads the table with
`deltalake <https://delta-io.github.io/delta-rs/>`_ (delta-rs, the Rust
implementation of the Delta protocol) at a version or a time, and turns it
into an ordinary Parquet :class:`~distfusion.io.sources.TableSource`: one work
unit per *active* data file of that version, so the planner and every runtime
read it natively with DataFusion, from where the files are. Nothing is listed:
everything comes from the log, as delta-rs reads it
(``DeltaTable.get_add_actions``):

```
_delta_log (JSON commits, checkpoints)
  -> delta-rs: the snapshot of one version
  -> add actions: path, size, numRecords, min/max/nullCount, partition values
  -> one WorkUnit per file: URL, size, live rows, partition values (from the log,
     not from directory names), FileRead (column names, deletion vector)
  -> TableSource "parquet": partition_cols, file_columns; unit_stats per file
```

- **Partition pruning and file skipping.** Partition values travel as the
  units' ``partition_values`` (the Hive-partition machinery of
  :mod:`distfusion.planner.prune_partitions`, whatever the directories are
  called); the statistics of every file are the source's ``unit_stats``
  (``{column: (min, max, null_count)}``), for the planner to skip the files
  a query's filters rule out.
- **Column mapping** (``delta.columnMapping.mode``): the files name columns
  by their physical names. In ``name`` mode the source says the physical name
  of every column (``options["file_columns"]``), and each task reads it so
  and renames it. In ``id`` mode columns are matched by Parquet field id, as
  the protocol asks: the footer of every file is read here (one range request
  per file, as ``register_parquet`` does) and each unit carries the names of
  its file's columns (a column the file lacks is NULL). Nested fields are
  renamed in the files too; a struct column of a column-mapped table is
  refused (DataFusion cannot rename a struct's fields by a cast).
- **Deletion vectors**: delta-rs reads them (``DeltaTable.deletion_vectors``:
  a selection vector per file); each affected unit carries its file's vector
  (:class:`~distfusion.io.sources.FileRead`), and the task drops those rows by
  position (:func:`distfusion.io.sources.register_scan`).
- **Schema evolution**: a file written before a column was added lacks it;
  DataFusion reads every file with the table's schema, and the column is NULL.
- **Reader features** delta-rs reads but distfusion would not apply (and any
  it does not know) are refused, naming the feature: never a wrong answer.

The coordinator's own DataFusion session gets deltalake's own reader of the
version (:func:`register_on_coordinator`): the schema DataFusion plans with,
and, for a query that runs on the coordinator only, deltalake's read.

Storage: a table on an object store (``s3://``, ``gs://``, ``az://``) is read
by the tasks through the store registered for its bucket
(:meth:`~distfusion.context.DistributedContext.register_object_store`);
delta-rs reads the log with ``storage_options`` made from that store when
none are given (:func:`storage_options_for`), and a table given
``storage_options`` for a bucket with no store gets a store made from them
(:func:`store_from_options`), so that the tasks can read it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
from datafusion import SessionContext, col

from distfusion.errors import PlanningError
from distfusion.io import object_store
from distfusion.io.sources import (
    FileRead,
    TableSource,
    WorkUnit,
    arrow_width,
    read_footers,
    sql_name,
)

__all__ = [
    "SUPPORTED_READER_FEATURES",
    "delta_source",
    "import_deltalake",
    "is_delta_table",
    "load_delta",
    "register_on_coordinator",
    "storage_options_for",
    "store_from_options",
]

SUPPORTED_READER_FEATURES = frozenset(
    {
        "columnMapping",  # applied: physical names / field ids (see the module docstring)
        "deletionVectors",  # applied: the tasks drop the deleted rows
        "timestampNtz",  # a type: timestamps without zone
        "v2Checkpoint",  # how the log is stored: delta-rs reads it
        "vacuumProtocolCheck",  # a rule for writers and VACUUM
        "variantType",  # refused per column (delta-rs marks tables with it by default)
    }
)
"""Delta reader features distfusion reads correctly (the protocol's names); a
table needing any other is refused."""

COORDINATOR_STORAGE_OPTIONS = {"max_retries": "3", "retry_timeout": "10s"}
"""delta-rs's log reads retry a few times within seconds unless told otherwise
(object_store's default retries for three minutes), as the coordinator's own
requests do (:data:`distfusion.io.object_store.COORDINATOR_RETRY`)."""

_STRING_STATS_PREFIX = 32
"""Writers may cut string statistics to a prefix of this many characters (Delta
Spark's ``dataSkippingStringPrefixLength``): a longer-looking maximum may be
below the true one, and is not used."""


def import_deltalake():
    """The ``deltalake`` module (delta-rs), imported on first use.

    Raises:
        ImportError: deltalake is not installed (says what to install).
    """
    try:
        import deltalake  # optional dependency
    except ImportError as exc:
        msg = (
            "reading Delta tables needs the deltalake package (delta-rs): "
            "pip install 'distfusion[delta]'"
        )
        raise ImportError(msg) from exc
    return deltalake


# ---------------------------------------------------------------------- storage
_S3_OPTIONS = {
    "region": ("aws_region", "region", "aws_default_region"),
    "endpoint": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
    "allow_http": ("aws_allow_http", "allow_http"),
    "access_key_id": ("aws_access_key_id", "access_key_id"),
    "secret_access_key": ("aws_secret_access_key", "secret_access_key"),
    "session_token": ("aws_session_token", "session_token", "aws_token", "token"),
}
_GCS_OPTIONS = {
    "service_account_path": (
        "google_service_account",
        "google_service_account_path",
        "service_account",
        "service_account_path",
    ),
}
_AZURE_OPTIONS = {
    "account": ("azure_storage_account_name", "account_name"),
    "access_key": (
        "azure_storage_account_key",
        "azure_storage_access_key",
        "account_key",
        "access_key",
    ),
    "bearer_token": ("azure_storage_token", "bearer_token", "token"),
    "client_id": ("azure_client_id", "azure_storage_client_id", "client_id"),
    "client_secret": ("azure_client_secret", "azure_storage_client_secret", "client_secret"),
    "tenant_id": ("azure_tenant_id", "azure_storage_tenant_id", "tenant_id"),
    "use_emulator": ("azure_storage_use_emulator", "use_emulator"),
    "sas_key": ("azure_storage_sas_key", "azure_storage_sas_token", "sas_key", "sas_token"),
}
# Store argument -> delta-rs (object_store) configuration key.
_TO_DELTA = {
    "s3": {
        "region": "AWS_REGION",
        "endpoint": "AWS_ENDPOINT_URL",
        "allow_http": "AWS_ALLOW_HTTP",
        "access_key_id": "AWS_ACCESS_KEY_ID",
        "secret_access_key": "AWS_SECRET_ACCESS_KEY",
        "session_token": "AWS_SESSION_TOKEN",
        "imdsv1_fallback": "AWS_IMDSV1_FALLBACK",
    },
    "gcs": {"service_account_path": "GOOGLE_SERVICE_ACCOUNT"},
    "azure": {
        "account": "AZURE_STORAGE_ACCOUNT_NAME",
        "access_key": "AZURE_STORAGE_ACCOUNT_KEY",
        "bearer_token": "AZURE_STORAGE_TOKEN",
        "client_id": "AZURE_CLIENT_ID",
        "client_secret": "AZURE_CLIENT_SECRET",
        "tenant_id": "AZURE_TENANT_ID",
        "use_emulator": "AZURE_STORAGE_USE_EMULATOR",
        "allow_http": "AZURE_ALLOW_HTTP",
        "use_fabric_endpoint": "AZURE_USE_FABRIC_ENDPOINT",
    },
}


def storage_options_for(url: str) -> dict[str, str]:
    """delta-rs ``storage_options`` equivalent to the store that serves ``url``.

    The store registered for ``url``'s bucket (or one made from the
    environment, :func:`distfusion.io.object_store.spec_for`): its endpoint,
    region, ``allow_http`` and explicit keys, by object_store's configuration
    names (``AWS_ENDPOINT_URL``, ...). Arguments the store was not given are
    left out: delta-rs then reads them from this process's environment, as
    the store does. Also :data:`COORDINATOR_STORAGE_OPTIONS`.

    Raises:
        ValueError: ``url`` is not an object store URL.
    """
    spec = object_store.spec_for(url)
    names = _TO_DELTA.get(spec.kind, {})
    out = dict(COORDINATOR_STORAGE_OPTIONS)
    for arg, value in spec.arguments:
        if value is None or value is False or arg not in names:
            continue
        out[names[arg]] = "true" if value is True else str(value)
    if spec.kind == "azure":
        pairs = dict(spec.arguments).get("sas_query_pairs")
        if pairs:
            out["AZURE_STORAGE_SAS_KEY"] = "&".join(f"{k}={v}" for k, v in pairs)
    return out


def _pick(options: dict[str, str], names: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    lowered = {k.lower(): v for k, v in options.items()}
    out = {}
    for arg, keys in names.items():
        for key in keys:
            if key in lowered:
                out[arg] = lowered[key]
                break
    return out


def _true(value: str) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def store_from_options(url: str, storage_options: dict[str, str]) -> Any:
    """A store for ``url``'s bucket made from delta-rs ``storage_options`` (None: not S3/GCS/Azure).

    What the tasks read a table's files with when it was given
    ``storage_options`` and no store is registered for its bucket: the same
    endpoint, region and keys (keys then travel to workers as a registered
    store's do: over authenticated channels only).

    Raises:
        ValueError: ``url`` is not an object store URL.
    """
    key = object_store.store_url(url)
    scheme, _, host = key.partition("://")
    if scheme in ("s3", "s3a"):
        a = _pick(storage_options, _S3_OPTIONS)
        endpoint = a.get("endpoint")
        allow_http = _true(a.get("allow_http", "false")) or (endpoint or "").startswith("http://")
        return object_store.AmazonS3(
            bucket_name=host,
            region=a.get("region"),
            access_key_id=a.get("access_key_id"),
            secret_access_key=a.get("secret_access_key"),
            session_token=a.get("session_token"),
            endpoint=endpoint,
            allow_http=allow_http,
        )
    if scheme in ("gs", "gcs"):
        a = _pick(storage_options, _GCS_OPTIONS)
        return object_store.GoogleCloud(
            bucket_name=host, service_account_path=a.get("service_account_path")
        )
    if scheme in ("az", "azure", "abfs", "abfss", "adl"):
        a = _pick(storage_options, _AZURE_OPTIONS)
        container, _, rest = host.partition("@")
        account = a.get("account") or (rest.split(".", 1)[0] if rest else None)
        sas = a.get("sas_key")
        pairs = (
            [tuple(p.split("=", 1)) for p in sas.lstrip("?").split("&") if "=" in p]
            if sas
            else None
        )
        return object_store.MicrosoftAzure(
            container_name=container,
            account=account,
            access_key=a.get("access_key"),
            bearer_token=a.get("bearer_token"),
            client_id=a.get("client_id"),
            client_secret=a.get("client_secret"),
            tenant_id=a.get("tenant_id"),
            sas_query_pairs=pairs,
            use_emulator=_true(a["use_emulator"]) if "use_emulator" in a else None,
        )
    return None


# ---------------------------------------------------------------------- loading
def _local(path: str) -> str:
    """A ``file://`` URI or a relative path as an absolute local path."""
    if path.startswith("file:"):
        return unquote(urlparse(path).path)
    return os.path.abspath(path)


def _message(exc: BaseException, secrets: list[str]) -> str:
    """delta-rs's error for people: no colour codes, no backtrace, no secrets, one paragraph."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = []
    for line in text.splitlines():
        if re.match(r"\s*\d+: ", line) or line.strip().startswith("at "):
            break  # a Rust backtrace follows
        lines.append(line.strip().lstrip("↳").strip())
    text = " ".join(s for s in lines if s) or type(exc).__name__
    text = object_store.redact(text)
    for s in secrets:
        if len(s) >= 4:
            text = text.replace(s, "***")
    return text[:600]


def _secrets(storage_options: dict[str, str] | None) -> list[str]:
    hidden = ("key", "secret", "token", "password", "sas", "credential")
    return [
        str(v) for k, v in (storage_options or {}).items() if any(h in k.lower() for h in hidden)
    ]


def load_delta(
    name: str,
    table: Any,
    version: int | None = None,
    timestamp: datetime.datetime | str | None = None,
    storage_options: dict[str, str] | None = None,
) -> Any:
    """The ``deltalake.DeltaTable`` of ``table`` at ``version`` or ``timestamp`` (else its latest).

    Args:
        name: the table's name in SQL (for messages).
        table: a path or URL of the table's root (the directory holding
            ``_delta_log``), or a ``deltalake.DeltaTable`` (used as loaded when
            neither ``version`` nor ``timestamp`` is given; otherwise loaded
            again from its URI, the caller's object untouched).
        version: the table version to read (time travel).
        timestamp: the version current at this time (``datetime``, naive
            meaning UTC, or an ISO 8601 / RFC 3339 string), as
            ``DeltaTable.load_as_version``.
        storage_options: delta-rs's options for an object store table; default:
            made from the store registered for its bucket
            (:func:`storage_options_for`).

    Raises:
        ImportError: deltalake is not installed.
        PlanningError: both ``version`` and ``timestamp`` given; nothing at
            ``table`` is a Delta table; the version does not exist or the time
            is before the table; the log cannot be read or is corrupt (the
            message names the table and where it is, without secrets).
    """
    dl = import_deltalake()
    if version is not None and timestamp is not None:
        msg = f"table {name!r}: give a version or a timestamp to read, not both"
        raise PlanningError(msg)
    given = isinstance(table, dl.DeltaTable)
    if given:
        uri = table.table_uri
        options = storage_options or getattr(table, "_storage_options", None)
        if version is None and timestamp is None:
            return table
    else:
        uri = os.fspath(table)
        if not object_store.is_url(uri):
            uri = _local(uri)
        options = storage_options
    where = uri if object_store.is_url(uri) else _local(uri)
    if object_store.is_url(uri) and options is None:
        options = storage_options_for(uri)
    elif object_store.is_url(uri) and options is not None:  # None: the branch above
        options = {**COORDINATOR_STORAGE_OPTIONS, **options}
    at = ""
    if version is not None:
        at = f" at version {version}"
    elif timestamp is not None:
        at = f" as of {timestamp}"
    try:
        dt = dl.DeltaTable(uri, version=version, storage_options=options)
        if timestamp is not None:
            dt.load_as_version(timestamp)
    except Exception as exc:  # deltalake's DeltaError and its kinds, OSError
        cause = _message(exc, _secrets(options))
        hint = ""
        if isinstance(exc, dl.exceptions.TableNotFoundError):
            hint = (
                ": no Delta table there (give the table's root directory, the one "
                "holding _delta_log)"
            )
        elif version is not None or timestamp is not None:
            hint = _latest_hint(dl, uri, options)
        msg = f"table {name!r}: cannot load the Delta table at {where}{at}{hint} ({cause})"
        raise PlanningError(msg) from None
    if timestamp is not None:
        _check_not_before(name, where, dt, timestamp)
    return dt


def _check_not_before(name: str, where: str, dt: Any, timestamp: datetime.datetime | str) -> None:
    """Raise when ``timestamp`` is before the table's first version still in its log.

    delta-rs's ``load_as_version`` loads the earliest version for such a
    time; reading it would answer with rows the table did not hold then.
    delta-rs dates a version by its log file's modification time, the
    commit's ``timestamp`` is the writer's clock: times within a second of
    the first commit (an object store's modification times are whole
    seconds) are left to delta-rs.
    """
    if isinstance(timestamp, str):
        try:
            timestamp = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
        except ValueError:  # delta-rs parsed it: its own format, not checked here
            return
    if timestamp.tzinfo is None:
        timestamp = timestamp.replace(tzinfo=datetime.UTC)
    if dt.version() != 0:  # a later version was current then (a truncated log: not checked)
        return
    stamps = [c["timestamp"] for c in dt.history() if c.get("timestamp") is not None]
    if not stamps:
        return
    committed = datetime.datetime.fromtimestamp(min(stamps) / 1000, datetime.UTC)
    if timestamp < committed - datetime.timedelta(seconds=1):
        msg = (
            f"table {name!r}: nothing at {where} as of {timestamp.isoformat()}: its earliest "
            f"version ({dt.version()}) was committed at {committed.isoformat()}"
        )
        raise PlanningError(msg)


def _latest_hint(dl, uri: str, options) -> str:
    """``": its latest version is N"`` when the table loads without time travel, else ``""``."""
    try:
        latest = dl.DeltaTable(uri, storage_options=options).version()
    except Exception:  # the log itself is unreadable: the cause says why
        return ""
    return f": no such version (its versions run to {latest})"


def is_delta_table(path: str, timeout_s: float = object_store.PROBE_TIMEOUT_S) -> bool:
    """Whether ``path`` (a local path, ``file://`` or object store URL) is a Delta table's root.

    A Delta table's root holds ``_delta_log/``: a local directory of that
    name, or on an object store any object below ``<path>/_delta_log/``
    (one listing request through the store of the bucket,
    :func:`distfusion.io.object_store.has_objects_below`, within ``timeout_s``
    seconds). deltalake is not asked: its ``DeltaTable.is_deltatable`` holds
    Python's GIL while it waits, so a server in the same process cannot
    answer it, and an error of it would read as "not a Delta table". A glob
    is never a table's root.

    Called by the PySpark drop-in for the paths of ``tables=`` before it
    reads them as Parquet files: a Delta table's directory also holds the
    files its log removed, which a listing would read again.

    Raises:
        PlanningError: the store cannot be reached or refuses within
            ``timeout_s`` (the message names the URL and the cause): whether
            it is a Delta table is then unknown, and it is not read as Parquet.
    """
    if object_store.is_glob(path):
        return False
    if not object_store.is_url(path):
        return os.path.isdir(os.path.join(_local(path), "_delta_log"))
    log = path.rstrip("/") + "/_delta_log/"
    try:
        return object_store.has_objects_below(log, timeout_s)
    except Exception as exc:  # obstore's: unreachable, refused, no bucket; or a bad URL
        msg = (
            f"cannot tell whether {path} is a Delta table or Parquet files: listing "
            f"{log} failed: {object_store.describe(exc)}"
        )
        raise PlanningError(msg) from None


# ---------------------------------------------------------------------- the source
def delta_source(name: str, dt: Any, schema: pa.Schema) -> TableSource:
    """Describe the version of Delta table ``dt`` as a Parquet source named ``name``.

    Args:
        name: the table name.
        dt: a loaded ``deltalake.DeltaTable`` (:func:`load_delta`).
        schema: the Arrow schema DataFusion plans the table with on the
            coordinator (the table provider's: logical names, DataFusion's
            types), which every task reads the files with.

    Returns:
        A ``"parquet"`` :class:`~distfusion.io.sources.TableSource`: a unit per
        active file (its URL, size, live rows, partition values), its
        ``unit_stats``, ``options["partition_cols"]`` and, with column
        mapping, ``options["file_columns"]``.

    Raises:
        PlanningError: the table needs a reader feature distfusion does not
            apply; a column-mapped table has a struct column, or a file of an
            ``id``-mapped table has no field ids; a variant column; a
            partition value DataFusion cannot read back from its text; the
            deletion vectors or footers cannot be read.
    """
    where = _where(dt)
    schema = pa.schema([f.remove_metadata() for f in schema])  # column mapping's: not needed
    protocol = dt.protocol()
    _check_protocol(name, where, protocol)
    metadata = dt.metadata()
    partition_cols = list(metadata.partition_columns)
    fields = {f["name"]: f for f in json.loads(dt.schema().to_json())["fields"]}
    _check_types(name, where, fields)
    mode = (metadata.configuration or {}).get("delta.columnMapping.mode", "none") or "none"
    physical = _physical_names(name, where, fields, mode)
    actions = pa.table(dt.get_add_actions(flatten=True))
    root = dt.table_uri.rstrip("/")
    paths = [_file_path(root, p) for p in actions.column("path").to_pylist()]
    rows = actions.column("num_records").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    values = _partition_texts(name, where, actions, partition_cols, schema)
    keeps = _deletion_vectors(name, where, dt, protocol, paths)
    per_file = (
        _columns_by_field_id(name, list(zip(paths, sizes, strict=True)), fields, partition_cols)
        if mode == "id"
        else [{} for _ in paths]
    )
    stats = _unit_stats(actions, schema, partition_cols, physical, paths, keeps)
    row_width = sum(arrow_width(f.type) for f in schema)
    units = []
    for i, path in enumerate(paths):
        keep = keeps.get(path)
        n = rows[i]
        if n is not None and keep is not None and len(keep):
            n -= len(keep) - pc.sum(keep).as_py()  # live rows: the deleted ones out
        read = FileRead(per_file[i], keep)
        units.append(
            WorkUnit(
                path=path,
                size_bytes=max(int(sizes[i]), (n or 0) * row_width),
                num_rows=n,
                data=read.to_bytes() if read.columns or keep is not None else b"",
                partition_values=values[i],
            )
        )
    options: dict = {
        "files_from": f"its Delta log (version {dt.version()})",
        "delta_table": dt.table_uri,  # where INSERT INTO writes (distfusion.table_write.sql)
    }
    if partition_cols:
        options["partition_cols"] = partition_cols
    if mode == "name":
        options["file_columns"] = {
            c: p for c, p in physical.items() if c not in partition_cols and p != c
        }
    return TableSource(name, "parquet", schema, tuple(units), {}, options, stats)


def _where(dt) -> str:
    """The table's location for messages: a local path or a URL."""
    uri = dt.table_uri
    return uri.rstrip("/") if object_store.is_url(uri) else _local(uri).rstrip("/")


def _check_protocol(name: str, where: str, protocol) -> None:
    """Refuse a table whose reader protocol needs what distfusion does not apply.

    Raises:
        PlanningError: reader version above 3, or a reader feature outside
            :data:`SUPPORTED_READER_FEATURES` (named).
    """
    if protocol.min_reader_version > 3:
        msg = (
            f"table {name!r} ({where}) needs Delta reader version "
            f"{protocol.min_reader_version}; distfusion reads versions 1 to 3"
        )
        raise PlanningError(msg)
    unknown = sorted(set(protocol.reader_features or ()) - SUPPORTED_READER_FEATURES)
    if unknown:
        msg = (
            f"table {name!r} ({where}) needs the Delta reader feature(s) {', '.join(unknown)}, "
            "which distfusion does not apply; it reads tables whose reader features are among "
            f"{', '.join(sorted(SUPPORTED_READER_FEATURES))}"
        )
        raise PlanningError(msg)


def _type_names(t: Any) -> list[str]:
    """Every type name in a Delta schema type (JSON form), nested ones included."""
    if isinstance(t, str):
        return [t]
    out = [t.get("type", "")]
    for key in ("elementType", "keyType", "valueType"):
        if key in t:
            out.extend(_type_names(t[key]))
    for f in t.get("fields", ()):
        out.extend(_type_names(f["type"]))
    return out


def _check_types(name: str, where: str, fields: dict[str, dict]) -> None:
    """Raises PlanningError for a variant column (no Arrow reading of it is agreed yet)."""
    for column, f in fields.items():
        if "variant" in _type_names(f["type"]):
            msg = (
                f"table {name!r} ({where}): column {column!r} is of Delta's variant type, "
                "which distfusion does not read"
            )
            raise PlanningError(msg)


def _nested_struct(t: Any) -> bool:
    """Whether a Delta schema type (JSON form) is or holds a struct."""
    return "struct" in _type_names(t)


def _physical_names(name: str, where: str, fields: dict[str, dict], mode: str) -> dict[str, str]:
    """Each column's name in the files: its physical name under column mapping, else its own.

    Raises:
        PlanningError: an unknown mapping mode; a column-mapped table with a
            struct column (its fields are renamed in the files too).
    """
    if mode == "none":
        return {c: c for c in fields}
    if mode not in ("name", "id"):
        msg = f"table {name!r} ({where}): unknown delta.columnMapping.mode {mode!r}"
        raise PlanningError(msg)
    out = {}
    for column, f in fields.items():
        if _nested_struct(f["type"]):
            msg = (
                f"table {name!r} ({where}) uses column mapping (delta.columnMapping.mode="
                f"{mode}) and column {column!r} holds a struct: the struct's fields have "
                "other names in the files, which distfusion cannot rename; read the table "
                "without that column through Spark or deltalake"
            )
            raise PlanningError(msg)
        out[column] = f.get("metadata", {}).get("delta.columnMapping.physicalName", column)
    return out


def _file_path(root: str, path: str) -> str:
    """A data file's path as units name it: a local path, or ``scheme://bucket/key``.

    ``path`` is the add action's path (a URI reference: relative to the
    table's root, or absolute for a shallow clone), percent-encoded as the
    protocol writes it; units name objects by their actual key.
    """
    if urlparse(path).scheme:
        full = path
    else:
        full = f"{root}/{path}"
    if full.startswith("file:"):
        return unquote(urlparse(full).path)
    scheme, _, rest = full.partition("://")
    return f"{scheme}://{unquote(rest)}"


def _partition_texts(
    name: str, where: str, actions: pa.Table, partition_cols: list[str], schema: pa.Schema
) -> list[tuple[str | None, ...]]:
    """Each file's partition values as text DataFusion casts back to the column's type.

    delta-rs gives them typed (``partition.<column>``, parsed from the log's
    strings as the protocol says); they are written as Arrow's text and read
    back here with DataFusion's casts, exactly as the tasks and the pruning
    will: a value that does not come back equal is refused rather than read
    as another value.

    Raises:
        PlanningError: a partition column's values do not survive the round
            trip (names the column).
    """
    n = actions.num_rows
    if not partition_cols:
        return [() for _ in range(n)]
    texts = {}
    ctx = SessionContext()
    for c in partition_cols:
        key = f"partition.{c}"
        typed = (
            actions.column(key).combine_chunks()
            if key in actions.column_names
            else pa.nulls(n, schema.field(c).type)
        )
        try:
            text = pc.cast(typed, pa.string())
            back = (
                ctx.from_arrow(pa.table({"v": text}))
                .select(col("v").cast(schema.field(c).type).alias("v"))
                .to_arrow_table()
                .column("v")
            )
            same = back.to_pylist() == pc.cast(typed, schema.field(c).type).to_pylist()
        except Exception as exc:  # pyarrow's or DataFusion's cast
            same, exc_text = False, str(exc).splitlines()[0]
        else:
            exc_text = ""
        if not same:
            msg = (
                f"table {name!r} ({where}): the values of partition column {c!r} "
                f"({schema.field(c).type}) cannot be carried as text and read back "
                f"unchanged{': ' + exc_text if exc_text else ''}"
            )
            raise PlanningError(msg)
        texts[c] = text.to_pylist()
    return [tuple(texts[c][i] for c in partition_cols) for i in range(n)]


def _deletion_vectors(
    name: str, where: str, dt, protocol, paths: list[str]
) -> dict[str, pa.BooleanArray]:
    """The selection vector of every file that has a deletion vector, by unit path.

    Read by delta-rs (``DeltaTable.deletion_vectors``: the vectors of the
    loaded version, materialised in memory here).

    Raises:
        PlanningError: delta-rs cannot read them (names the table), or names
            a file that is not among the table's active files.
    """
    if "deletionVectors" not in (protocol.reader_features or ()):
        return {}
    try:
        table = pa.table(dt.deletion_vectors())
    except Exception as exc:  # deltalake's errors
        msg = (
            f"table {name!r} ({where}): cannot read its deletion vectors, so the rows they "
            f"delete cannot be left out: {_message(exc, [])}"
        )
        raise PlanningError(msg) from None
    known = set(paths)
    out = {}
    vectors = table.column("selection_vector").combine_chunks()
    for i, uri in enumerate(table.column("filepath").to_pylist()):
        path = _file_path("", uri) if urlparse(uri).scheme else uri
        if path not in known:
            msg = (
                f"table {name!r} ({where}): a deletion vector names {path}, which is not "
                "one of the table's files; its deleted rows cannot be applied"
            )
            raise PlanningError(msg)
        keep = vectors[i].values
        out[path] = pa.array(keep.to_pylist(), pa.bool_()) if keep.offset else keep
    return out


def _columns_by_field_id(
    name: str,
    files: list[tuple[str, int]],
    fields: dict[str, dict],
    partition_cols: list[str],
) -> list[dict[str, str | None]]:
    """Per file of an ``id``-mapped table: each column's name in the file, found by field id.

    Reads every file's footer (its Parquet schema's field ids). A column
    whose id the file does not hold is None (read as NULL).

    Raises:
        PlanningError: a footer cannot be read, or a file has no field ids.
    """
    footers = read_footers(name, files)
    ids = {
        c: str(f.get("metadata", {}).get("delta.columnMapping.id"))
        for c, f in fields.items()
        if c not in partition_cols
    }
    out = []
    for (path, _), md in zip(files, footers, strict=True):
        by_id = {}
        for f in md.schema.to_arrow_schema():
            fid = (f.metadata or {}).get(b"PARQUET:field_id")
            if fid is not None:
                by_id[fid.decode()] = f.name
        if not by_id:
            msg = (
                f"table {name!r} maps columns by field id (delta.columnMapping.mode=id), but "
                f"{path} has no Parquet field ids: its columns cannot be matched"
            )
            raise PlanningError(msg)
        out.append({c: by_id.get(i) for c, i in ids.items() if by_id.get(i) != c})
    return out


def _unit_stats(
    actions: pa.Table,
    schema: pa.Schema,
    partition_cols: list[str],
    physical: dict[str, str],
    paths: list[str],
    keeps: dict[str, pa.BooleanArray],
) -> dict[str, dict[str, tuple]]:
    """``unit path -> {column: (min, max, null_count)}`` from the log's statistics.

    Only values that bound the file's live rows are kept (a None is
    unknown): floating-point columns have none (a NaN is outside a Parquet
    min/max and above every number in DataFusion's comparisons); a string
    maximum that may be a cut prefix is dropped; a timestamp maximum, which
    writers may store in milliseconds, is raised to the end of its
    millisecond; a file with a deletion vector has no null count (the log's
    counts its deleted rows too). A partition column's bounds are its value.
    """
    names = set(actions.column_names)
    rows = actions.column("num_records").to_pylist()
    cols: dict[str, tuple[list, list, list]] = {}
    n = actions.num_rows
    for f in schema:
        if f.name in partition_cols:
            continue
        if pa.types.is_floating(f.type) or not (
            pa.types.is_integer(f.type)
            or pa.types.is_decimal(f.type)
            or pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type)
            or pa.types.is_string_view(f.type)
            or pa.types.is_date(f.type)
            or pa.types.is_timestamp(f.type)
            or pa.types.is_boolean(f.type)
        ):
            continue
        p = physical.get(f.name, f.name)

        def values(kind: str, p: str = p) -> list:
            key = f"{kind}.{p}"
            return actions.column(key).to_pylist() if key in names else [None] * n

        lows, highs, nulls = values("min"), values("max"), values("null_count")
        if pa.types.is_timestamp(f.type):
            step = datetime.timedelta(microseconds=999)
            highs = [None if h is None else h + step for h in highs]
        if (
            pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type)
            or pa.types.is_string_view(f.type)
        ):
            highs = [None if h is None or len(h) >= _STRING_STATS_PREFIX else h for h in highs]
        cols[f.name] = (lows, highs, nulls)
    typed = {
        c: actions.column(f"partition.{c}").to_pylist() if f"partition.{c}" in names else [None] * n
        for c in partition_cols
    }
    out = {}
    for i, path in enumerate(paths):
        dv = path in keeps
        stats = {}
        for c, (lows, highs, nulls) in cols.items():
            stats[c] = (lows[i], highs[i], None if dv else nulls[i])
        for c, vals in typed.items():
            v = vals[i]
            stats[c] = (v, v, (None if dv else rows[i]) if v is None else 0)
        out[path] = stats
    return out


def register_on_coordinator(ctx: SessionContext, name: str, dt: Any) -> tuple[pa.Schema, str]:
    """Register ``dt`` as ``name`` in the coordinator's ``ctx``, read by deltalake's own reader.

    The coordinator's DataFusion session plans every query with this table
    (its schema; the filters DataFusion pushes into its scan, which the
    planner prunes files with), and reads it only for a query that runs on
    the coordinator alone (:meth:`~distfusion.context.DistributedDataFrame.coordinator_only`).
    It is, as deltalake reads the version:

    - a table without column mapping or deletion vectors: deltalake's PyArrow
      dataset (``DeltaTable.to_pyarrow_dataset``: the version's files, their
      partition values, deltalake's own file system, local or remote).
      DataFusion pushes filters into it, so they reach the planner in the scan;
    - otherwise (the dataset reads mapped columns as NULL and refuses
      deletion vectors, in deltalake 1.6): delta-rs's DataFusion table provider
      (``__datafusion_table_provider__``), whose scan applies both. From
      datafusion-python 55 it reads local tables only: on an object store it
      finds no store ("No suitable object store found"), so such a table
      cannot be read on the coordinator (the second value says why).

    Returns:
        ``(schema, unreadable)``: the table's Arrow schema as DataFusion plans
        it, and why the coordinator cannot read it (``""`` when it can).

    Raises:
        Exception: DataFusion's or delta-rs's error (the caller wraps it).
    """
    mode = (dt.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    features = set(dt.protocol().reader_features or ())
    dataset = None
    if (mode or "none") == "none" and "deletionVectors" not in features:
        try:
            dataset = dt.to_pyarrow_dataset()
        except Exception:  # deltalake refuses the table for PyArrow: its provider reads it
            dataset = None
    unreadable = ""
    if dataset is not None:
        ctx.register_dataset(sql_name(name), dataset)
    else:
        ctx.register_table(sql_name(name), dt)
        if object_store.is_url(dt.table_uri):
            unreadable = (
                "delta-rs's table provider cannot read a table on an object store from "
                "datafusion-python (deltalake 1.6), and deltalake's PyArrow dataset does not "
                "apply column mapping or deletion vectors"
            )
    return ctx.table(sql_name(name)).schema(), unreadable
