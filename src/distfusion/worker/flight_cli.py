"""The command line of a Flight worker (``distfusion worker``).

Also ``python -m distfusion.worker.flight_cli --port 0``.

Kept apart from the server (:mod:`distfusion.worker.flight_server`) so that
building the parser does not import ``pyarrow.flight``, an optional
dependency; it is imported when a worker actually starts.
"""

from __future__ import annotations

import argparse
import logging
import sys

from distfusion import udfs
from distfusion.protocol.messages import DEFAULT_QUERY_TTL_S, TOKEN_ENV

__all__ = ["add_arguments", "main", "run"]


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
        help=f"shared secret every call must carry (default: ${TOKEN_ENV}; unset: accept all)",
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
        help="load Python UDFs for SQL from a module (a datafusion ScalarUDF or a list "
        "of them); repeatable",
    )


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def run(args: argparse.Namespace) -> int:
    """Start a worker from :func:`add_arguments` options; serve until SIGINT/SIGTERM.

    Prints ``distfusion worker listening on URL`` once it accepts calls.

    Raises:
        OSError: a certificate file cannot be read.
        pyarrow.ArrowException: the port cannot be bound.
        ImportError, ValueError: a ``--udf`` module or name cannot be loaded.
    """
    # optional dependency: the server imports pyarrow.flight
    from distfusion.worker.flight_server import FlightWorker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for reference in args.udf:
        names = udfs.load(reference)
        logging.getLogger("distfusion.worker").info("UDFs from %s: %s", reference, names)
    worker = FlightWorker(
        args.host,
        args.port,
        token=args.token,
        tls_cert_chain=_read(args.tls_cert),
        tls_private_key=_read(args.tls_key),
        tls_root_certs=_read(args.tls_root_certs),
        slots=args.slots,
        query_ttl_s=args.query_ttl,
        advertise_url=args.advertise_url,
    )
    print(f"distfusion worker listening on {worker.url}", flush=True)
    try:
        worker.serve()
    except KeyboardInterrupt:
        pass
    finally:
        worker.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m distfusion.worker.flight_cli [options]`` (see ``distfusion worker -h``)."""
    parser = argparse.ArgumentParser(
        prog="distfusion worker", description="Run an Arrow Flight worker."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
