"""The command line of a Flight worker (``distfusion worker``).

Also ``python -m distfusion.worker.flight_cli --port 0``.

Safe defaults: a worker runs any task plan it is given, and plans read any
file the worker can. It binds 127.0.0.1 unless told otherwise, and refuses a
non-loopback ``--host`` without a token unless ``--insecure`` (then warns).
The token comes from ``--token-file`` or ``$DISTFUSION_WORKER_TOKEN`` (or
``$DISTFUSION_TOKEN``, shared with the coordinator) rather than ``--token``,
which any user of the machine can read in ``ps``.

Kept apart from the server (:mod:`distfusion.worker.flight_server`) so that
building the parser does not import ``pyarrow.flight``, an optional
dependency; it is imported when a worker actually starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from distfusion import udfs
from distfusion.protocol.messages import DEFAULT_QUERY_TTL_S, TOKEN_ENV
from distfusion.worker.memory import parse_bytes

WORKER_TOKEN_ENV = "DISTFUSION_WORKER_TOKEN"
"""Environment variable a worker reads its token from (before ``DISTFUSION_TOKEN``)."""

__all__ = ["WORKER_TOKEN_ENV", "add_arguments", "main", "resolve_token", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the worker's options to ``parser``."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=50051,
        help="TCP port; 0 picks a free one (default: %(default)s)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="shared secret every call must carry (visible in ps: prefer --token-file; "
        f"default: ${WORKER_TOKEN_ENV}, then ${TOKEN_ENV}; unset: accept all, loopback only)",
    )
    parser.add_argument(
        "--token-file", default=None, help="read the shared secret from this file (stripped)"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without a token (anyone reaching it runs plans)",
    )
    parser.add_argument(
        "--memory",
        default=None,
        help="memory for this worker's tasks, e.g. 8g (split between --slots; "
        "default: half of the machine's memory)",
    )
    parser.add_argument(
        "--spill-dir",
        default=None,
        help="directory for spill files (default: the system's temp directory)",
    )
    parser.add_argument("--tls-cert", default=None, help="PEM certificate chain: serve grpc+tls://")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-root-certs",
        default=None,
        help="PEM roots to verify other TLS workers (default: --tls-cert)",
    )
    parser.add_argument(
        "--slots", type=int, default=1, help="tasks run at the same time (default: %(default)s)"
    )
    parser.add_argument(
        "--query-ttl",
        type=float,
        default=DEFAULT_QUERY_TTL_S,
        help="idle seconds before a query's state is dropped (default: %(default)s)",
    )
    parser.add_argument(
        "--advertise-url", default=None, help="URL this worker names itself by in errors"
    )
    parser.add_argument(
        "--udf",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="load Python UDFs for SQL from a module (a datafusion ScalarUDF, AggregateUDF "
        "or WindowUDF, or a list of them); repeatable",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop (as on SIGTERM) when standard input closes: the process that started "
        "the worker holds the other end of that pipe, so the worker ends with it, however "
        "it ends (used by FlightRuntime.with_local_workers)",
    )


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def resolve_token(args: argparse.Namespace, environ=os.environ) -> str:
    """The worker's token; ``""`` when none is set.

    The first set of ``--token``, ``--token-file``, ``$DISTFUSION_WORKER_TOKEN``
    and ``$DISTFUSION_TOKEN``.

    Raises:
        ValueError: both ``--token`` and ``--token-file``, or the file is empty.
        OSError: the token file cannot be read.
    """
    token_file = getattr(args, "token_file", None)
    if args.token is not None and token_file:
        msg = "give the token with --token or --token-file, not both"
        raise ValueError(msg)
    if args.token is not None:
        return args.token
    if token_file:
        with open(token_file) as f:
            token = f.read().strip()
        if not token:
            msg = f"the token file {token_file} is empty"
            raise ValueError(msg)
        return token
    return environ.get(WORKER_TOKEN_ENV) or environ.get(TOKEN_ENV) or ""


def run(args: argparse.Namespace) -> int:
    """Start a worker from :func:`add_arguments` options; serve until SIGINT/SIGTERM.

    Prints ``distfusion worker listening on URL`` once it accepts calls.

    Returns:
        0 after serving; 2 when the options are refused (a non-loopback
        ``--host`` without a token and without ``--insecure``, an unreadable
        or empty token file, an unreadable certificate, a bad ``--memory``,
        a ``--udf`` module or name that cannot be loaded): the reason is
        printed to stderr.

    Raises:
        pyarrow.ArrowException: the port cannot be bound.
    """
    # optional dependency: the server imports pyarrow.flight
    from distfusion.worker.flight_server import FlightWorker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        functions = udfs.Functions()  # this worker's: every task session here gets them
        for reference in args.udf:
            loaded = udfs.load(reference)
            for u in loaded:
                functions.register(u)
            names = [u.name for u in loaded]
            logging.getLogger("distfusion.worker").info("UDFs from %s: %s", reference, names)
        token = resolve_token(args)
        slots = max(1, args.slots)
        memory = getattr(args, "memory", None)
        # Given explicitly: split as is (the default budget has a floor, this does not).
        per_task = max(1, parse_bytes(memory) // slots) if memory else None
        worker = FlightWorker(
            args.host,
            args.port,
            token=token,
            tls_cert_chain=_read(args.tls_cert),
            tls_private_key=_read(args.tls_key),
            tls_root_certs=_read(args.tls_root_certs),
            slots=slots,
            query_ttl_s=args.query_ttl,
            advertise_url=args.advertise_url,
            memory_per_task_bytes=per_task,
            spill_dir=getattr(args, "spill_dir", None),
            insecure=getattr(args, "insecure", False),
            functions=functions,
        )
    except (ValueError, OSError, ImportError, AttributeError) as exc:
        print(f"distfusion worker: error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(f"distfusion worker listening on {worker.url}", flush=True)
    if getattr(args, "exit_with_parent", False):
        _close_when_stdin_closes(worker)
    # Served on gRPC's threads since the constructor; this thread waits in Python, so
    # SIGTERM (the default of `kill`, and how runtimes stop their workers) closes the
    # worker like SIGINT does: its spill directory and tasks do not outlive it.
    # (FlightWorker.serve() blocks in native code, where SIGTERM ended the process
    # without cleanup.)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.2) and not worker.closed:
            pass
    except KeyboardInterrupt:
        pass
    finally:
        worker.close()
    return 0


def _close_when_stdin_closes(worker) -> None:
    """Close ``worker`` once standard input reaches its end (the parent exited or died).

    A pipe's write end closes with the process holding it, however that
    process ends (exit, exception, SIGKILL), where ``PR_SET_PDEATHSIG``
    follows the thread that started the child, and only on Linux.
    """

    def watch() -> None:
        # os.read on the descriptor, not sys.stdin.buffer: a daemon thread blocked in a
        # buffered read holds its lock, and the interpreter exiting (SIGTERM) then
        # aborts ("could not acquire lock for <stdin> at interpreter shutdown").
        try:
            fd = sys.stdin.fileno()
            while os.read(fd, 65536):
                pass
        except (OSError, ValueError):  # no readable stdin: the parent's end is gone too
            pass
        logging.getLogger("distfusion.worker").info("parent gone (stdin closed): stopping")
        worker.close()

    threading.Thread(target=watch, name="distfusion-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """``python -m distfusion.worker.flight_cli [options]`` (see ``distfusion worker -h``)."""
    parser = argparse.ArgumentParser(
        prog="distfusion worker", description="Run an Arrow Flight worker."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
