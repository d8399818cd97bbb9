"""A real S3-protocol server on 127.0.0.1 for tests and benchmarks: moto's, in its own process.

``python -P tests/s3_server.py`` serves moto's S3 on a free port of 127.0.0.1 and
prints ``listening on http://127.0.0.1:PORT``; :class:`S3Server` starts it and
stops it (SIGTERM, then SIGKILL). Every request is recorded:
``GET /__requests`` answers the log as JSON (method, path, query, range,
status), ``DELETE /__requests`` clears it, so a test counts the requests a
query made (listings, HEADs, footer reads, ranges) as events.

moto accepts any credentials; the tests give workers fake ones in their
environment (``tests/conftest.py``), as production workers get theirs. moto
keeps the objects in the server's memory and is a Python server: reads are
several times slower than from local disk, so compare engines on the same server.

Needs moto and boto3 (the ``test`` extra: ``pip install 'distfusion[test]'``). It
lives in the repository's ``tests/``, not in the installed package (which does
not depend on moto): the tests import it as ``tests.s3_server``, ``distfusion
bench --local-s3`` loads this file from the checkout distfusion is installed from.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from urllib.request import Request, urlopen

__all__ = ["S3Server", "main"]

_READY = "listening on "

_INSTALL = "the local S3 server needs moto and boto3: pip install 'distfusion[test]'"

_MISSING_MODULE = re.compile(r"(?:ModuleNotFoundError|ImportError): (.+)")
_TAIL_LINES = 20  # of the server's error output, in the error of a server that did not start


def _exits_soon(proc: subprocess.Popen, wait_s: float = 5.0) -> bool:
    """Whether ``proc`` ends within ``wait_s`` seconds (its error output is then complete)."""
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return False
    return True


class _Recorder:
    """WSGI middleware: moto's app, with every request recorded and ``/__requests`` served."""

    def __init__(self, app) -> None:
        self.app = app
        self.log: list[dict] = []
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == "/__requests":
            with self.lock:
                if environ["REQUEST_METHOD"] == "DELETE":
                    self.log.clear()
                body = json.dumps(self.log).encode()
            start_response("200 OK", [("Content-Type", "application/json")])
            return [body]
        entry = {
            "method": environ["REQUEST_METHOD"],
            "path": environ.get("PATH_INFO", ""),
            "query": environ.get("QUERY_STRING", ""),
            "range": environ.get("HTTP_RANGE", ""),
        }

        def recording_start(status, headers, exc_info=None):
            entry["status"] = int(status.split()[0])
            for name, value in headers:
                if name.lower() == "content-range":
                    entry["content_range"] = value
            with self.lock:
                self.log.append(entry)
            return start_response(status, headers, exc_info)

        return self.app(environ, recording_start)


def main() -> None:
    """Serve moto's S3 on 127.0.0.1 (a free port), recording requests, until SIGTERM."""
    from moto.moto_server.werkzeug_app import (  # optional: the test extra
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = _Recorder(DomainDispatcherApplication(create_backend_app))
    server = make_server(
        "127.0.0.1", 0, app, True, request_handler=_QuietHandler(MotoRequestHandler)
    )
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"{_READY}http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


def _QuietHandler(base):  # noqa: N802 -- a class factory
    class Quiet(base):
        def log_request(self, *args, **kwargs) -> None:  # one line per request: too many
            pass

    return Quiet


class S3Server:
    """A running ``python -P tests/s3_server.py`` process; :attr:`endpoint` is its URL.

    Args:
        timeout_s: seconds to wait for the server to announce its URL.

    Raises:
        ImportError: boto3 is missing here, or moto (or another module) in the
            server's process: names the module and says to install the
            ``test`` extra (``pip install 'distfusion[test]'``).
        RuntimeError: the server did not announce its URL within ``timeout_s``,
            or exited; the message ends with its error output.
    """

    def __init__(self, timeout_s: float = 60.0) -> None:
        try:
            import boto3  # optional: the test extra
        except ImportError as exc:
            raise ImportError(f"{exc}: {_INSTALL}") from exc
        # The server's stderr goes to a file, not a pipe nobody reads while it runs.
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="distfusion-s3-")
        self.proc = subprocess.Popen(
            # this file as a script, whatever the working directory; -P: its
            # directory (tests/) is not put first on the server's sys.path
            [sys.executable, "-P", str(Path(__file__).resolve())],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        line = ""
        if select.select([self.proc.stdout], [], [], timeout_s)[0]:
            line = self.proc.stdout.readline()
        if not line.startswith(_READY):
            self._fail(line, timeout_s)
        self.endpoint = line[len(_READY) :].strip()
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def _fail(self, line: str, timeout_s: float) -> None:
        """Stop the server that did not start and raise what it said (see the class's Raises)."""
        exited = self.proc.poll() is not None or _exits_soon(self.proc)
        self._end_process()
        self._stderr.seek(0)
        said = self._stderr.read().strip()
        self.stop()
        missing = _MISSING_MODULE.findall(said)
        if missing:
            msg = f"the S3 test server did not start: {missing[-1]}: {_INSTALL}"
            raise ImportError(msg)
        why = f"it exited ({self.proc.returncode})" if exited else f"no URL in {timeout_s:g} s"
        tail = "\n".join(said.splitlines()[-_TAIL_LINES:])
        said = (line + tail).strip() or "(nothing)"
        msg = f"the S3 test server did not start: {why}; its output:\n{said}"
        raise RuntimeError(msg)

    def create_bucket(self, name: str) -> None:
        """Make bucket ``name`` (no error when it exists)."""
        try:
            self.client.create_bucket(Bucket=name)
        except self.client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def upload_dir(self, local: str | os.PathLike, bucket: str, prefix: str) -> None:
        """Upload every file below ``local`` to ``s3://bucket/prefix/<relative path>``."""
        root = Path(local)
        for f in sorted(root.rglob("*")):
            if f.is_file() and not f.name.startswith("."):
                self.client.upload_file(
                    str(f), bucket, f"{prefix}/{f.relative_to(root).as_posix()}"
                )

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """The object keys of ``bucket`` below ``prefix``, sorted."""
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix
        ):
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)

    def requests(self) -> list[dict]:
        """Every request served since the last :meth:`clear_requests`, in order."""
        with urlopen(f"{self.endpoint}/__requests", timeout=10) as r:
            return json.loads(r.read())

    def clear_requests(self) -> None:
        """Forget the requests served so far."""
        with urlopen(Request(f"{self.endpoint}/__requests", method="DELETE"), timeout=10) as r:
            r.read()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s."""
        self._end_process()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._stderr.close()

    def _end_process(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    main()
