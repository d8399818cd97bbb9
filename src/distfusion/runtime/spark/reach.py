"""Whether a Spark master or a Spark Connect server answers, asked before Spark is (issue 41).

Spark itself says little and late: a master whose host does not resolve fails
``getOrCreate`` after about 67 s with ``Py4JJavaError: <exception str() failed>``
(the ``UnknownHostException`` only in Spark's log), and a Connect client with
no server retries every call for minutes without a word, then hangs the
interpreter's exit in its exit hook. So before an embedded session starts
with a cluster master (:func:`check_master`), and before a Connect session
is used (:func:`check_connect_server`), distfusion asks the network itself,
in seconds, and raises a :class:`~distfusion.errors.TransportError` that
names the URL, the host and the cause, and says what to do.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import threading
from urllib.parse import urlparse

from distfusion.errors import TransportError

__all__ = ["REACH_TIMEOUT_S", "check_connect_server", "check_master", "unreachable"]

REACH_TIMEOUT_S = 5.0
"""Seconds to resolve a host, and again to connect to it (each check at most twice this)."""

_DEFAULT_PORTS = {"spark": 7077, "mesos": 5050, "k8s": 443}


def unreachable(host: str, port: int, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why ``host:port`` takes no TCP connection, or None when it does.

    The name is resolved in a thread (``getaddrinfo`` has no timeout of its
    own), then each address is tried with a ``timeout_s`` connect.

    Returns:
        ``"host 'x' does not resolve (...)"``, ``"nothing listens on x:p
        (connection refused)"``, ``"x:p does not answer within 5 s"``, ..., or None.
    """
    found: list = []

    def resolve() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:  # socket.gaierror
            found.append(exc)

    thread = threading.Thread(target=resolve, name="distfusion-resolve", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not found:
        return f"host {host!r} does not resolve within {timeout_s:g} s"
    if isinstance(found[0], OSError):
        return f"host {host!r} does not resolve ({found[0].strerror or found[0]})"
    why = ""
    for family, kind, proto, _, address in found[0]:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(timeout_s)
            try:
                sock.connect(address)
            except ConnectionRefusedError:
                why = f"nothing listens on {host}:{port} (connection refused)"
            except TimeoutError:
                why = f"{host}:{port} does not answer within {timeout_s:g} s"
            except OSError as exc:
                why = f"{host}:{port} cannot be reached ({exc.strerror or exc})"
            else:
                return None
    return why or f"{host}:{port} cannot be reached"


def master_addresses(master: str) -> list[tuple[str, int]]:
    """The ``(host, port)`` a Spark master URL names; empty for masters without one.

    ``spark://h1:7077,h2:7077`` (standalone, with standby masters),
    ``k8s://https://host:6443``, ``mesos://host:5050``; ``local[...]``,
    ``local-cluster[...]`` and ``yarn`` (its address is in Hadoop's
    configuration) name none.
    """
    scheme, sep, rest = master.partition("://")
    if not sep or scheme not in _DEFAULT_PORTS:
        return []
    if scheme == "k8s":
        url = urlparse(rest if "://" in rest else f"https://{rest}")
        if not url.hostname:
            return []
        return [(url.hostname, url.port or (80 if url.scheme == "http" else 443))]
    out = []
    for part in rest.split("/", 1)[0].split(","):
        url = urlparse(f"//{part}")
        if url.hostname:
            out.append((url.hostname, url.port or _DEFAULT_PORTS[scheme]))
    return out


def check_master(master: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise at once when no master of Spark master URL ``master`` can be reached.

    Called by :class:`~distfusion.runtime.spark.SparkRuntime` before it
    starts an embedded session with ``master``; masters without an address
    (``local[*]``, ``yarn``) pass. A standalone URL listing several masters
    passes when one of them takes a connection.

    Raises:
        TransportError: every master's host does not resolve or takes no
            connection; names the URL, each host and the cause.
    """
    addresses = master_addresses(master)
    found = [unreachable(host, port, timeout_s) for host, port in addresses]
    causes = [c for c in found if c is not None]
    if not addresses or len(causes) < len(found):
        return
    msg = (
        f"the Spark master {master} cannot be reached: {'; '.join(causes)}. Check the "
        "host and port in master= (--master), that this machine resolves and reaches "
        "them, and that the master runs (Spark's sbin/start-master.sh on that host)"
    )
    raise TransportError(msg)


def connect_server_hint() -> str:
    """How to start a Spark Connect server on this machine (pip's pyspark ships the script)."""
    script = "sbin/start-connect-server.sh"
    spec = importlib.util.find_spec("pyspark")  # its directory, without importing it
    if spec is not None and spec.submodule_search_locations:
        script = os.path.join(spec.submodule_search_locations[0], script)
    return (
        f"start one with {script} (it listens on port 15002; pass --master to choose "
        'where its tasks run), or use SparkSession.builder.remote("local") for a local one'
    )


def _ready(channel, timeout_s: float) -> bool:
    """Whether gRPC ``channel`` connects within ``timeout_s`` (as ``grpc.channel_ready_future``)."""
    ready = threading.Event()

    def watch(state) -> None:  # a grpc.ChannelConnectivity
        if state.name == "READY":
            ready.set()

    channel.subscribe(watch, try_to_connect=True)
    try:
        return ready.wait(timeout_s)
    finally:
        channel.unsubscribe(watch)


def _proxied() -> bool:
    """Whether gRPC's clients go through a proxy here (its environment variables)."""
    names = ("grpc_proxy", "https_proxy", "http_proxy")
    return any(os.environ.get(n) or os.environ.get(n.upper()) for n in names)


def check_connect_server(spark, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise at once when Spark Connect session ``spark``'s server takes no connection.

    Called whenever distfusion is handed a Connect session (``SparkRuntime(spark=...)``,
    so ``distfusion.spark.sql``, ``from_spark``, ``runtime_from_name("spark",
    connect=URL)``), before any call to the server. It connects to the
    server's TCP port (when no proxy is set: a refused connection fails at
    once), then waits for the client's gRPC channel (with its own TLS and
    proxy settings), at most ``timeout_s`` each. When it fails, the
    session's channel is closed, so that pyspark's exit hook does not wait
    minutes for the server too; make a new session once a server listens. A
    stopped session passes (its own error follows).

    Raises:
        TransportError: no connection within ``timeout_s``; names the
            ``sc://`` URL and the cause, and says how to start a server.
    """
    client = spark.client
    if getattr(client, "is_closed", False):
        return
    builder = getattr(client, "_builder", None)  # pyspark's ChannelBuilder: the URL's host:port
    endpoint = getattr(builder, "endpoint", None) or f"{client.host}:15002"
    host, _, port = endpoint.rpartition(":")
    # Straight to the server first (a refused connection fails at once), unless a proxy
    # stands between: then only gRPC, which goes through it, can tell.
    why = None if _proxied() else unreachable(host.strip("[]"), int(port), timeout_s)
    channel = getattr(client, "_channel", None)
    if why is None and channel is not None and not _ready(channel, timeout_s):
        why = f"no gRPC connection within {timeout_s:g} s (not a Connect server? TLS?)"
    if why is None:
        return
    with contextlib.suppress(Exception):
        client.close()  # no RPC: closes the channel; the exit hook then skips its cleanup calls
    msg = f"no Spark Connect server answers at sc://{endpoint}: {why}; {connect_server_hint()}"
    raise TransportError(msg)
