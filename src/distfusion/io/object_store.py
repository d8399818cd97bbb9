"""Object stores: tables read and written where they live (S3, GCS, Azure, HTTP).

Registered as in DataFusion, with DataFusion's store classes and arguments::

    from distfusion import DistributedContext
    from distfusion.io.object_store import AmazonS3

    ctx = DistributedContext()
    ctx.register_object_store("s3://", AmazonS3(bucket_name="lake", region="eu-west-1"), "lake")
    ctx.register_parquet("lineitem", "s3://lake/tpch/lineitem/")

The classes here (:class:`AmazonS3`, :class:`GoogleCloud`, :class:`MicrosoftAzure`,
:class:`Http`, :class:`LocalFileSystem`) *are* DataFusion's
(``datafusion.object_store``): subclasses that also remember the arguments they
were made with, so that every worker builds the same store again (a Rust
object cannot travel). A URL whose bucket has no store registered gets one made
from the environment when a table is registered (``s3://b`` -> ``AmazonS3(b)``
with ``AWS_REGION`` / ``AWS_ENDPOINT_URL`` of the coordinator), as
``datafusion-cli`` does.

**One registry per context**, as a DataFusion ``SessionContext`` has
(:class:`Stores`): a store registered on a context is this context's, and its
queries' task sessions get exactly its stores, before their plans are decoded
(:mod:`distfusion.session`): Spark executors with each stage or task plan
(pickled by Spark), Flight workers through a ``set_object_stores`` call for
the query (:data:`~distfusion.protocol.messages.ACTION_SET_OBJECT_STORES`),
kept for that query only. The coordinator's own listing and footer reads go
through this process's registry (:data:`PROCESS`), which a context's
registrations also update.

**Credentials.** A store made without keys takes them, on every worker, from
that worker's environment, as the AWS, Google and Azure SDKs and Spark
executors do (DataFusion's builders read ``AWS_*`` / ``AZURE_*`` variables,
profiles and instance metadata). Keys given explicitly on the coordinator
travel only over an authenticated channel (Spark's task closure, a Flight
worker with a token; the Flight runtime refuses to send them to workers
without one), and never in task plans, ``explain()``, logs, errors or
metrics: a spec's ``repr`` hides them and :func:`redact` blanks their values
out of error messages.

**Listing and footers** on the coordinator use `obstore
<https://developmentseed.org/obstore/>`_, the Python binding of the Rust
``object_store`` crate that DataFusion itself reads with: the same URLs,
configuration keys and credential chain as the tasks' reads, and a store for
HTTP too (``pyarrow.fs`` has its own AWS SDK configuration and no HTTP store;
fsspec would be a third). Its requests retry a few times within seconds
(:data:`COORDINATOR_RETRY`), so a wrong endpoint fails registration quickly.
"""

from __future__ import annotations

import fnmatch
import inspect
import io
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import datafusion.object_store as _df_store
import obstore
import pyarrow as pa
import pyarrow.parquet as pq
from datafusion import SessionContext
from obstore.store import AzureStore, GCSStore, HTTPStore, LocalStore, S3Store

__all__ = [
    "AmazonS3",
    "GoogleCloud",
    "Http",
    "LocalFileSystem",
    "MicrosoftAzure",
    "StoreSpec",
    "add_to",
    "copy_object",
    "datafusion_url",
    "delete_objects",
    "deregister",
    "describe",
    "glob_base",
    "has_objects_below",
    "hint",
    "is_glob",
    "install",
    "is_url",
    "list_objects",
    "list_prefix",
    "missing_objects",
    "object_sizes",
    "open_input",
    "put_bytes",
    "put_file",
    "read_parquet_metadata",
    "read_parquet_metadata_all",
    "redact",
    "register",
    "registered",
    "spec_for",
    "specs",
    "store_url",
]

SCHEMES = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "azure", "http", "https")
"""URL schemes read through an object store (``file://`` and plain paths are local files)."""


def is_url(path: str) -> bool:
    """Whether ``path`` names an object in an object store (``s3://b/k``), not a local file."""
    scheme = urlparse(path).scheme.lower()
    return scheme in SCHEMES


def store_url(url: str) -> str:
    """``scheme://host`` of ``url``: the key its store is registered under (as DataFusion's).

    Raises:
        ValueError: ``url`` has no scheme or no host (bucket).
    """
    parsed = urlparse(url)
    if not parsed.scheme or not parsed.netloc:
        msg = f"not an object store URL (scheme://bucket/key): {url!r}"
        raise ValueError(msg)
    return f"{parsed.scheme.lower()}://{parsed.netloc}"


def datafusion_url(path: str) -> str:
    """What to give DataFusion to read the object or file ``path`` names.

    Units name an object by ``scheme://bucket/`` and its key as the store
    lists it; DataFusion percent-decodes the path of a URL it is given, so a
    key with ``%`` in it (Hive-style partition directories escape ``:``, ``
    ``, ``/`` and ``%`` so: ``ts=2024-01-01%2010%3A00%3A00``) would name
    another object. The key is percent-encoded here (``/`` kept). A local
    path is returned as it is.

    Example:
        >>> datafusion_url("s3://lake/t/s=a%20b/part-0.parquet")
        's3://lake/t/s%3Da%2520b/part-0.parquet'
    """
    if not is_url(path):
        return path
    scheme, _, rest = path.partition("://")
    host, _, key = rest.partition("/")  # not urlparse: a key may hold "?" or "#"
    return f"{scheme}://{host}/{quote(key, safe='/')}"


# ---------------------------------------------------------------------- store classes
class _Remembers:
    """A DataFusion store that remembers its constructor's arguments (:meth:`spec`)."""

    kind: str = ""
    secret_arguments: tuple[str, ...] = ()
    _base: type

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(self._base).bind(*args, **kwargs)
        self.arguments = dict(bound.arguments)
        """The arguments the store was made with, by name."""

    def spec(self) -> StoreSpec:
        """What another process needs to build this store again."""
        return StoreSpec(self.kind, tuple(sorted(self.arguments.items())))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_shown(self.arguments, self.secret_arguments)})"


class AmazonS3(_Remembers, _df_store.AmazonS3):
    """DataFusion's ``AmazonS3`` store (same arguments), rebuilt on every worker.

    Arguments not given are read from each worker's environment (``AWS_*``
    variables, profiles, instance metadata), as DataFusion's builder does; but
    ``allow_http`` is always this argument (DataFusion sets it explicitly).
    """

    kind = "s3"
    secret_arguments = ("access_key_id", "secret_access_key", "session_token")
    _base = _df_store.AmazonS3


class GoogleCloud(_Remembers, _df_store.GoogleCloud):
    """DataFusion's ``GoogleCloud`` store (same arguments), rebuilt on every worker.

    Without ``service_account_path``, each worker uses Google's application
    default credentials.
    """

    kind = "gcs"
    _base = _df_store.GoogleCloud


class MicrosoftAzure(_Remembers, _df_store.MicrosoftAzure):
    """DataFusion's ``MicrosoftAzure`` store (same arguments), rebuilt on every worker.

    Arguments not given are read from each worker's environment (``AZURE_*``).
    """

    kind = "azure"
    secret_arguments = ("access_key", "bearer_token", "client_secret", "sas_query_pairs")
    _base = _df_store.MicrosoftAzure


class Http(_Remembers, _df_store.Http):
    """DataFusion's ``Http`` store (same arguments): files served over HTTP(S)."""

    kind = "http"
    _base = _df_store.Http


class LocalFileSystem(_Remembers, _df_store.LocalFileSystem):
    """DataFusion's ``LocalFileSystem`` store (same arguments)."""

    kind = "local"
    _base = _df_store.LocalFileSystem


_CLASSES: dict[str, type[_Remembers]] = {
    c.kind: c for c in (AmazonS3, GoogleCloud, MicrosoftAzure, Http, LocalFileSystem)
}


def _shown(arguments: dict, secret: tuple[str, ...]) -> str:
    return ", ".join(
        f"{k}={'***' if k in secret and v is not None else repr(v)}" for k, v in arguments.items()
    )


@dataclass(frozen=True)
class StoreSpec:
    """A store as plain data: its kind and constructor arguments.

    What travels to the workers (never inside a task plan); ``repr`` hides
    secret arguments.

    Attributes:
        kind: ``"s3"``, ``"gcs"``, ``"azure"``, ``"http"`` or ``"local"``.
        arguments: ``(name, value)`` pairs of the store class's constructor.
    """

    kind: str
    arguments: tuple[tuple[str, Any], ...]

    @property
    def secret_arguments(self) -> tuple[str, ...]:
        """The names of the arguments that are credentials."""
        return _CLASSES[self.kind].secret_arguments

    def secrets(self) -> list[str]:
        """The values of the credential arguments given (as text), to keep out of messages."""
        out: list[str] = []
        for name, value in self.arguments:
            if name not in self.secret_arguments or value is None:
                continue
            if isinstance(value, list | tuple):  # Azure's SAS query pairs
                out.extend(str(v) for pair in value for v in pair[1:])
            else:
                out.append(str(value))
        return [s for s in out if s]

    @property
    def has_secrets(self) -> bool:
        """Whether credentials were given explicitly (not from the workers' environment)."""
        return bool(self.secrets())

    def build(self) -> Any:
        """The DataFusion store (one of this module's classes).

        Raises:
            ValueError: ``kind`` is unknown.
            Exception: DataFusion's error (a panic surfaced as an exception)
                when the arguments do not make a store.
        """
        cls = _CLASSES.get(self.kind)
        if cls is None:
            msg = f"unknown object store kind {self.kind!r}"
            raise ValueError(msg)
        return cls(**dict(self.arguments))

    def to_json(self) -> dict:
        """The spec as JSON-able data, secrets included (for an authenticated channel only)."""
        return {"kind": self.kind, "arguments": [[k, v] for k, v in self.arguments]}

    @classmethod
    def from_json(cls, d: dict) -> StoreSpec:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: ``d`` is not a store spec.
        """
        try:
            kind = str(d["kind"])
            arguments = tuple((str(k), _tuples(v)) for k, v in d["arguments"])
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"not an object store spec: {exc}"
            raise ValueError(msg) from exc
        if kind not in _CLASSES:
            msg = f"not an object store spec: unknown kind {kind!r}"
            raise ValueError(msg)
        return cls(kind, arguments)

    def __repr__(self) -> str:
        return f"StoreSpec({self.kind}: {_shown(dict(self.arguments), self.secret_arguments)})"


def _tuples(value: Any) -> Any:
    """JSON lists back as tuples (Azure's SAS pairs), other values as they are."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


# ---------------------------------------------------------------------- the registry
def _key(scheme: str, host: str | None) -> tuple[str, str, str]:
    """``(key, scheme://, host)`` of a registration, as DataFusion's ``register_object_store``."""
    scheme = scheme.lower()
    scheme = scheme if scheme.endswith("://") else scheme.rstrip(":/") + "://"
    host = host or ""
    return scheme + host, scheme, host


_BUILT: dict[tuple[str, StoreSpec], Any] = {}
"""Stores built from shipped specs in this process, by ``(key, spec)``: an equal spec
makes an equal store, so tasks of every query share one."""


class Stores:
    """Object stores by ``scheme://host``: one :class:`~distfusion.context.DistributedContext`'s.

    As a DataFusion ``SessionContext`` holds its stores, each context holds
    its own, and its queries' task sessions get exactly those
    (:class:`~distfusion.session.SessionSettings`). The module's functions
    (:func:`register`, :func:`spec_for`, the listing and footer reads) use
    the process's registry, :data:`PROCESS`, for the coordinator's own reads.
    Thread-safe.
    """

    def __init__(self) -> None:
        # "s3://bucket" -> the DataFusion store object, and its spec.
        self._stores: dict[str, Any] = {}
        self._specs: dict[str, StoreSpec] = {}
        self._lock = threading.Lock()
        self.version = 0
        """A number that changes whenever a store is registered or dropped here."""

    @classmethod
    def from_specs(cls, shipped: tuple[tuple[str, StoreSpec], ...]) -> Stores:
        """The stores of ``shipped`` (:meth:`specs`), built in this process (once per spec).

        Raises:
            ValueError: a spec's kind is unknown.
            Exception: DataFusion's error when a spec does not make a store.
        """
        made = cls()
        for key, spec in shipped:
            store = _BUILT.get((key, spec))
            if store is None:
                store = _BUILT[(key, spec)] = spec.build()
            made._stores[key] = store
            made._specs[key] = spec
        return made

    def copy(self) -> Stores:
        """A registry of the same stores that registrations made later here do not change."""
        made = Stores()
        with self._lock:
            made._stores, made._specs = dict(self._stores), dict(self._specs)
        return made

    def overlaid(self, top: Stores) -> Stores:
        """A copy of these stores with ``top``'s in place of any of the same key."""
        made: Stores = self.copy()
        own: Stores = top.copy()
        made._stores.update(own._stores)
        made._specs.update(own._specs)
        return made

    def register(self, scheme: str, store: Any, host: str | None = None) -> str:
        """Use ``store`` for URLs ``scheme://host/...``.

        Args:
            scheme: ``"s3://"`` (or ``"s3"``), ``"gs://"``, ``"az://"``, ``"https://"``, ...
            store: one of this module's store classes.
            host: the bucket, container or host the store serves (as DataFusion's
                ``host`` argument).

        Returns:
            The registry key, ``scheme://host``.

        Raises:
            TypeError: ``store`` is a plain DataFusion store (it cannot be built
                again on another worker: use this module's class of the same name).
        """
        if not isinstance(store, _Remembers):
            name = type(store).__name__
            msg = (
                f"register_object_store takes distfusion.io.object_store.{name} (the same class "
                f"and arguments as DataFusion's {name}, which also remembers them so that every "
                f"worker can build the store again), got {type(store).__module__}.{name}"
            )
            raise TypeError(msg)
        key, _, _ = _key(scheme, host)
        with self._lock:
            self._stores[key] = store
            self._specs[key] = store.spec()
            self.version += 1
        return key

    def deregister(self, scheme: str, host: str | None = None) -> None:
        """Forget the store of ``scheme://host`` (no error when there is none)."""
        key, _, _ = _key(scheme, host)
        with self._lock:
            if self._stores.pop(key, None) is not None:
                self._specs.pop(key, None)
                self.version += 1

    def registered(self) -> dict[str, StoreSpec]:
        """The stores' specs by ``scheme://host`` (a copy)."""
        with self._lock:
            return dict(self._specs)

    def specs(self) -> tuple[tuple[str, StoreSpec], ...]:
        """``(scheme://host, spec)`` of every store: what other processes get."""
        with self._lock:
            return tuple(self._specs.items())

    def add_to(self, ctx: SessionContext) -> None:
        """Register every store in ``ctx`` (a task's or the coordinator's session)."""
        with self._lock:
            stores = list(self._stores.items())
        for key, store in stores:
            scheme, _, host = key.partition("://")
            ctx.register_object_store(scheme + "://", store, host or None)

    def install(self, shipped: Iterable[tuple[str, StoreSpec]]) -> None:
        """Register the stores of ``shipped`` specs (each built once per process).

        A store whose spec equals the one registered under its key is not built again.

        Raises:
            Exception: DataFusion's error when a spec does not make a store.
        """
        for key, spec in shipped:
            with self._lock:
                if self._specs.get(key) == spec:
                    continue
            built: Stores = Stores.from_specs(((key, spec),))
            with self._lock:
                self._stores[key] = built._stores[key]
                self._specs[key] = spec
                self.version += 1

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Stores({', '.join(sorted(self._specs))})"


PROCESS = Stores()
"""This process's stores: what the coordinator's own listing and footer reads use
(every context's registrations, and stores made from the environment)."""


def register(scheme: str, store: Any, host: str | None = None) -> str:
    """:meth:`Stores.register` on :data:`PROCESS` (the coordinator's own reads)."""
    return PROCESS.register(scheme, store, host)


def deregister(scheme: str, host: str | None = None) -> None:
    """:meth:`Stores.deregister` on :data:`PROCESS`."""
    PROCESS.deregister(scheme, host)


def registered() -> dict[str, StoreSpec]:
    """The stores of :data:`PROCESS` by ``scheme://host`` (a copy)."""
    return PROCESS.registered()


def specs() -> tuple[tuple[str, StoreSpec], ...]:
    """``(scheme://host, spec)`` of every store of :data:`PROCESS`."""
    return PROCESS.specs()


def install(shipped: Iterable[tuple[str, StoreSpec]]) -> None:
    """:meth:`Stores.install` on :data:`PROCESS` (an executor's own reads and writes).

    Raises:
        Exception: DataFusion's error when a spec does not make a store.
    """
    PROCESS.install(shipped)


def add_to(ctx: SessionContext) -> None:
    """Register every store of :data:`PROCESS` in ``ctx`` (the coordinator's own session)."""
    PROCESS.add_to(ctx)


def spec_for(url: str) -> StoreSpec:
    """The spec of the store serving ``url``; one made from the environment if none is registered.

    A store made here is registered (:func:`register`): ``s3://b`` gets
    ``AmazonS3(bucket_name=b)`` with ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and
    ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT`` of this process (``allow_http``
    when the endpoint is ``http://`` or ``AWS_ALLOW_HTTP`` is true); ``gs://b``
    ``GoogleCloud(b)``; ``az://c``, ``abfs[s]://c@account...``
    ``MicrosoftAzure(c, account)``; ``http(s)://host`` ``Http``. Credentials
    are never taken here: each worker reads its own.

    Raises:
        ValueError: ``url`` is not an object store URL.
    """
    key = store_url(url)
    spec = PROCESS.registered().get(key)
    if spec is not None:
        return spec
    scheme, _, host = key.partition("://")
    register(scheme, _from_environment(scheme, host), host)
    return registered()[key]


def _from_environment(scheme: str, host: str) -> Any:
    env = os.environ
    if scheme in ("s3", "s3a"):
        endpoint = env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")
        allow_http = (endpoint or "").startswith("http://") or env.get(
            "AWS_ALLOW_HTTP", ""
        ).lower() in ("1", "true")
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        return AmazonS3(bucket_name=host, region=region, endpoint=endpoint, allow_http=allow_http)
    if scheme in ("gs", "gcs"):
        return GoogleCloud(bucket_name=host)
    if scheme in ("az", "azure", "abfs", "abfss", "adl"):
        container, _, rest = host.partition("@")
        account = rest.split(".", 1)[0] if rest else None
        return MicrosoftAzure(container_name=container, account=account)
    if scheme in ("http", "https"):
        return Http(f"{scheme}://{host}")
    msg = f"no object store for {scheme}:// URLs"
    raise ValueError(msg)


def redact(text: str) -> str:
    """``text`` with every explicitly given credential of this process's stores blanked out."""
    secrets = [s for spec in PROCESS.registered().values() for s in spec.secrets()]
    for s in sorted(secrets, key=len, reverse=True):
        if len(s) >= 4:  # never blank out a word of the message itself
            text = text.replace(s, "***")
    return text


def describe(exc: BaseException) -> str:
    """An object store error's message for people: its first paragraph, credentials blanked out.

    obstore's messages end with a ``Debug source:`` dump of the error chain.
    """
    text = str(exc).split("\n\nDebug source:", 1)[0].strip() or type(exc).__name__
    return redact(text)


_REFUSED = (
    "169.254.169.254",  # instance metadata asked: no credentials in the environment
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "403 Forbidden",
    "401 Unauthorized",
    "NoCredentialProviders",
    "credential",
)


def hint(message: str) -> str:
    """What to do about an object store's refusal in ``message`` (``""`` when it is none).

    A worker without credentials (DataFusion then asks the instance metadata
    endpoint), or with keys the store refuses, gets a hint to give the worker
    credentials in its own environment or the store explicit keys.
    """
    if "Object Store error" not in message and "S3 error" not in message:
        return ""
    if not any(r in message for r in _REFUSED):
        return ""
    return (
        " -- the object store refused this worker's request: it has no credentials, or "
        "the store rejects them; give each worker credentials in its environment "
        "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance role; "
        "AZURE_STORAGE_*; GOOGLE_APPLICATION_CREDENTIALS) or register the store with "
        "explicit keys (distfusion.io.object_store)"
    )


# ---------------------------------------------------------------------- obstore access
COORDINATOR_RETRY = {
    "max_retries": 3,
    "retry_timeout": timedelta(seconds=10),
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2)},
}
"""Retries of the coordinator's listing and footer requests: a wrong endpoint or a
server that does not answer fails registration within seconds (object_store's
default retries for three minutes)."""

_CLIENT = {"connect_timeout": timedelta(seconds=5), "timeout": timedelta(seconds=60)}
_OBSTORES: dict[tuple[StoreSpec, str, float | None], Any] = {}

PROBE_TIMEOUT_S = 10.0
"""Seconds a probe of the coordinator (:func:`has_objects_below`) waits at most,
retries included, before it fails naming the URL."""


def _obstore(spec: StoreSpec, key: str, timeout_s: float | None = None) -> Any:
    """An obstore store equivalent to ``spec`` (cached per process).

    ``timeout_s``: every request, and its retries, end within this many
    seconds (default: :data:`_CLIENT`'s timeouts, :data:`COORDINATOR_RETRY`).
    """
    cached = _OBSTORES.get((spec, key, timeout_s))
    if cached is not None:
        return cached
    a = {k: v for k, v in spec.arguments if v is not None}
    client: dict[str, Any] = dict(_CLIENT)
    retry: dict[str, Any] = COORDINATOR_RETRY
    if timeout_s is not None:
        bound = timedelta(seconds=timeout_s)
        client = {"connect_timeout": min(client["connect_timeout"], bound), "timeout": bound}
        retry = {**COORDINATOR_RETRY, "retry_timeout": bound}
    if a.get("allow_http"):
        client["allow_http"] = True
    # obstore's ClientConfig and RetryConfig (typed dicts, checked by obstore).
    common: dict[str, Any] = {"client_options": client, "retry_config": retry}
    store: S3Store | GCSStore | AzureStore | HTTPStore | LocalStore
    config: Any  # the store's config: built from the spec's arguments, checked by obstore
    if spec.kind == "s3":
        config = {
            name: a[arg]
            for arg, name in (
                ("region", "region"),
                ("access_key_id", "access_key_id"),
                ("secret_access_key", "secret_access_key"),
                ("session_token", "session_token"),
                ("endpoint", "endpoint"),
            )
            if arg in a
        }
        if a.get("imdsv1_fallback"):
            config["imdsv1_fallback"] = True
        store = S3Store(a["bucket_name"], config=config, **common)
    elif spec.kind == "gcs":
        config = (
            {"service_account": a["service_account_path"]} if "service_account_path" in a else {}
        )
        store = GCSStore(a["bucket_name"], config=config, **common)
    elif spec.kind == "azure":
        config = {
            name: a[arg]
            for arg, name in (
                ("account", "account_name"),
                ("access_key", "account_key"),
                ("bearer_token", "token"),
                ("client_id", "client_id"),
                ("client_secret", "client_secret"),
                ("tenant_id", "tenant_id"),
                ("use_emulator", "use_emulator"),
                ("use_fabric_endpoint", "use_fabric_endpoint"),
            )
            if arg in a
        }
        if "sas_query_pairs" in a:
            config["sas_key"] = "&".join(f"{k}={v}" for k, v in a["sas_query_pairs"])
        store = AzureStore(a["container_name"], config=config, **common)
    elif spec.kind == "http":
        store = HTTPStore.from_url(key, **common)
    else:
        store = LocalStore(a.get("prefix"))
    _OBSTORES[(spec, key, timeout_s)] = store
    return store


def _located(url: str, timeout_s: float | None = None) -> tuple[Any, str]:
    """``(obstore store, path inside it)`` for ``url`` (a store from the environment if none).

    The path is everything after the bucket: a key may hold ``?`` or ``#``
    (a glob's ``?``), which are no query or fragment in a bucket's URL; an
    HTTP(S) URL's path is its URL path.
    """
    spec = spec_for(url)
    key = store_url(url)
    if spec.kind == "http":
        path = urlparse(url).path.lstrip("/")
    else:
        path = url.partition("://")[2].partition("/")[2].lstrip("/")
    return _obstore(spec, key, timeout_s), path


def has_objects_below(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether any object's key starts with ``url``'s path and ``/`` (``url`` as a "directory").

    One listing request for one key, through the store registered for
    ``url``'s bucket (or made from the environment), ending within
    ``timeout_s`` seconds, retries included. obstore waits without holding
    Python's GIL, so a server in this very process (moto's
    ``ThreadedMotoServer``) answers it. Used to tell a Delta table's root
    (``_delta_log/``) from Parquet files before anything is read.

    Raises:
        ValueError: ``url`` is not an object store URL.
        OSError: the store cannot be reached within ``timeout_s``, or refuses
            (credentials, a missing bucket): obstore's error.
    """
    store, path = _located(url, timeout_s)
    prefix = path.rstrip("/")
    for chunk in obstore.list(store, prefix + "/" if prefix else None, chunk_size=1):
        if chunk:
            return True
    return False


def _hidden(relative: str) -> bool:
    """A path below the listed prefix in a hidden or temporary folder or file (``_*``, ``.*``)."""
    return any(part.startswith(("_", ".")) for part in relative.split("/") if part)


def _glob_match(key: str, pattern: str) -> bool:
    """``key`` matches ``pattern`` segment by segment: ``*`` does not cross ``/``."""
    parts, pats = key.split("/"), pattern.split("/")
    return len(parts) == len(pats) and all(
        fnmatch.fnmatchcase(k, p) for k, p in zip(parts, pats, strict=True)
    )


def is_glob(path: str) -> bool:
    """Whether ``path`` holds a glob character (``*``, ``?``, ``[``)."""
    return any(ch in path for ch in "*?[")


def glob_base(url: str) -> str:
    """The "directory" of glob ``url`` before its first glob character, without the ``/``.

    Example:
        >>> glob_base("s3://lake/t/dt=*/part-*.parquet")
        's3://lake/t'
    """
    head = url[: min(i for i, ch in enumerate(url) if ch in "*?[")]
    return head.rsplit("/", 1)[0] if "/" in head else ""


def list_objects(url: str, extension: str) -> list[tuple[str, int]]:
    """The ``extension`` objects at ``url``: ``(URL, size in bytes)``, sorted by URL.

    ``url`` names one object (``s3://b/t/part-0.parquet``), a "directory"
    (``s3://b/t/``, listed recursively; with or without the slash), or a glob
    (``s3://b/t/*.parquet``, ``*`` ``?`` ``[...]`` over the whole key).
    Objects in folders or with names starting with ``_`` or ``.`` below the
    listed prefix (``_SUCCESS``, ``_temporary/``, ``.crc``) are skipped, as
    Spark and Hive skip them.

    Raises:
        FileNotFoundError: nothing with ``extension`` is there.
        OSError: the store cannot be reached, or refuses (credentials, a
            missing bucket): obstore's error, its message naming the URL.
    """
    store, path = _located(url)
    base = store_url(url)
    glob = is_glob(path)
    if not glob and path.endswith(extension):
        try:
            meta = obstore.head(store, path)
            return [(f"{base}/{meta['path']}", int(meta["size"]))]
        except FileNotFoundError:
            pass  # a "directory" named like a file (Spark writes t.parquet/): list it
    prefix = (glob_base(path) if glob else path).rstrip("/")
    out = []
    for chunk in obstore.list(store, prefix + "/" if prefix else None, chunk_size=1000):
        for meta in chunk:
            key = meta["path"]
            if _hidden(key[len(prefix) :]) or not key.endswith(extension):
                continue
            if glob and not _glob_match(key, path):
                continue
            out.append((f"{base}/{key}", int(meta["size"])))
    if not out:
        msg = f"no {extension} files found at {url!r}"
        raise FileNotFoundError(msg)
    return sorted(out)


FOOTER_READ_BYTES = 64 * 1024
"""Bytes read from the end of a Parquet file for its footer in one request (the
whole footer of most files; a larger footer takes a second request)."""


def read_parquet_metadata(url: str, size: int) -> pq.FileMetaData:
    """The Parquet footer of the object at ``url`` of ``size`` bytes (one or two range reads).

    Raises:
        OSError: the object cannot be read (obstore's error, naming the URL).
        ValueError: it is not a Parquet file.
    """
    store, path = _located(url)
    start = max(0, size - FOOTER_READ_BYTES)
    tail = bytes(obstore.get_range(store, path, start=start, end=size))
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        msg = f"{url} is not a Parquet file (no PAR1 magic at its end)"
        raise ValueError(msg)
    footer = int.from_bytes(tail[-8:-4], "little") + 8
    if footer > len(tail):
        tail = bytes(obstore.get_range(store, path, start=size - footer, end=size))
    return pq.ParquetFile(pa.BufferReader(tail)).metadata


def read_parquet_metadata_all(
    objects: list[tuple[str, int]], threads: int = 16
) -> list[pq.FileMetaData]:
    """:func:`read_parquet_metadata` of every ``(url, size)``, ``threads`` requests at a time."""
    if len(objects) <= 1:
        return [read_parquet_metadata(u, s) for u, s in objects]
    with ThreadPoolExecutor(min(threads, len(objects))) as pool:
        return list(pool.map(lambda o: read_parquet_metadata(*o), objects))


def missing_objects(urls: list[str], threads: int = 16) -> list[str]:
    """The URLs of ``urls`` that name no object now.

    Objects of one "directory" are looked up with one listing from just below
    the first of them (object stores list keys in order), a lone object with
    one HEAD request; the requests run in parallel.

    Raises:
        OSError: the store cannot be reached or refuses a request (other than "not found").
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for url in urls:
        key = store_url(url)
        directory = urlparse(url).path.lstrip("/").rpartition("/")[0]
        groups.setdefault((key, directory), []).append(url)

    def gone(group: list[str]) -> list[str]:
        store, _ = _located(group[0])
        paths = {_located(u)[1]: u for u in group}
        if len(paths) == 1:
            try:
                obstore.head(store, next(iter(paths)))
            except FileNotFoundError:
                return group
            return []
        directory = next(iter(paths)).rpartition("/")[0]
        first, last = min(paths), max(paths)
        found: set[str] = set()
        listing = obstore.list(
            store, directory + "/" if directory else None, offset=first[:-1], chunk_size=1000
        )
        for chunk in listing:
            found.update(meta["path"] for meta in chunk if meta["path"] in paths)
            if not chunk or chunk[-1]["path"] >= last:
                break
        return [u for p, u in paths.items() if p not in found]

    if not groups:
        return []
    with ThreadPoolExecutor(min(threads, len(groups))) as pool:
        return [u for missing in pool.map(gone, groups.values()) for u in missing]


def object_sizes(urls: list[str], threads: int = 16) -> list[int]:
    """The size in bytes of each object of ``urls`` (one HEAD request each, in parallel).

    Raises:
        FileNotFoundError: an object does not exist (obstore's, naming it).
        OSError: the store cannot be reached or refuses (obstore's error).
    """

    def size(url: str) -> int:
        store, path = _located(url)
        return int(obstore.head(store, path)["size"])

    if len(urls) <= 1:
        return [size(u) for u in urls]
    with ThreadPoolExecutor(min(threads, len(urls))) as pool:
        return list(pool.map(size, urls))


def list_prefix(url: str) -> list[str]:
    """Every object below ``url`` taken as a "directory" (hidden ones too), as URLs, sorted.

    Raises:
        OSError: the store cannot be reached or refuses (obstore's error).
    """
    store, path = _located(url)
    base = store_url(url)
    prefix = path.rstrip("/")
    out = []
    for chunk in obstore.list(store, prefix + "/" if prefix else None, chunk_size=1000):
        out += [f"{base}/{meta['path']}" for meta in chunk]
    return sorted(out)


def put_file(url: str, local_path: str) -> None:
    """Upload the local file ``local_path`` as object ``url`` (multipart when large).

    Raises:
        OSError: the store refuses or cannot be reached (obstore's error).
    """
    store, path = _located(url)
    obstore.put(store, path, Path(local_path))


def put_bytes(url: str, data: bytes) -> None:
    """Write ``data`` as object ``url`` (one request).

    Raises:
        OSError: the store refuses or cannot be reached (obstore's error).
    """
    store, path = _located(url)
    obstore.put(store, path, data, use_multipart=False)


def copy_object(source: str, target: str) -> None:
    """Copy object ``source`` to ``target`` in the same store, on the server (no data here).

    Raises:
        ValueError: the URLs are in different stores.
        OSError: the store refuses or cannot be reached (obstore's error).
    """
    if store_url(source) != store_url(target):
        msg = f"cannot copy {source} to another store ({target})"
        raise ValueError(msg)
    store, src = _located(source)
    _, dst = _located(target)
    obstore.copy(store, src, dst)


def delete_objects(urls: list[str]) -> None:
    """Delete the objects ``urls`` (batched per store; a missing one is no error).

    Raises:
        OSError: the store refuses or cannot be reached (obstore's error).
    """
    by_store: dict[str, list[str]] = {}
    for url in urls:
        by_store.setdefault(store_url(url), []).append(url)
    for group in by_store.values():
        store, _ = _located(group[0])
        paths = [_located(u)[1] for u in group]
        for start in range(0, len(paths), 1000):
            obstore.delete(store, paths[start : start + 1000])


def open_input(url: str, buffer_bytes: int = 1024 * 1024) -> Any:
    """A readable, seekable binary file of the object at ``url``, read through its store.

    For readers that need a file object (pyarrow's ``ParquetFile``): reads
    are range requests of ``buffer_bytes`` or more, as asked. The store is
    the one registered for ``url``'s bucket (or made from the environment).

    Raises:
        FileNotFoundError: no object at ``url``.
        OSError: the store cannot be reached or refuses (obstore's error).
    """
    store, path = _located(url)
    return _ObjectFile(obstore.open_reader(store, path, buffer_size=buffer_bytes))


class _ObjectFile(io.RawIOBase):
    """obstore's ``ReadableFile`` as a Python raw file (pyarrow needs ``closed``, ``readinto``)."""

    def __init__(self, reader: Any) -> None:
        super().__init__()
        self._reader = reader

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._reader.seek(offset, whence)

    def tell(self) -> int:
        return self._reader.tell()

    def read(self, size: int = -1) -> bytes:
        return bytes(
            self._reader.read(size) if size is not None and size >= 0 else self._reader.read()
        )

    def readinto(self, buffer) -> int:
        data = self._reader.read(len(buffer))
        n = len(data)
        memoryview(buffer)[:n] = memoryview(data)
        return n

    def close(self) -> None:
        if not self.closed:
            self._reader.close()
        super().close()
