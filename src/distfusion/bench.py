"""``distfusion bench tpch``: distfusion against its peers, measured in the same run.

For every query, each engine runs once to warm up (file caches, JIT-free but
allocator and OS caches), then ``runs`` timed runs, interleaved engine by engine
so that machine noise hits all of them alike (``--no-warmup``: that first run
is timed, as the first of ``runs``, for long runs at scale). Reported: the
median wall time (seconds) per query and engine with the machine's peak extra
memory during its timed runs (:class:`PeakMemory`), the sum of medians as the total, and each
peer's ratio to distfusion (``ratio = distfusion / peer``; below 1 means
distfusion is faster).

The peers (``--peers``, :data:`PEERS`)::

    datafusion   single-node DataFusion on the same files (default)
    spark-sql    Spark SQL on distfusion's SparkSession (default with --runtime spark)
    local        distfusion on its local runtime, same --workers, own DistributedContext
    flight       distfusion on the Flight runtime, 3 local worker processes (its default),
                 own DistributedContext
    static       distfusion on the same runtime with DistributedConfig(adaptive=False)
    no-metrics   distfusion on the same runtime with DistributedConfig(operator_metrics=False):
                 what collecting every task's operator metrics costs
    spark-connect
                 distfusion through a Spark Connect session on the same Spark application
                 (the Connect service started in its JVM,
                 :mod:`distfusion.runtime.spark.connect_server`): what a Connect
                 session costs against the classic one (Spark runtime only)

``--local-s3`` reads the data from a local S3-protocol server (moto's, in its own
process on 127.0.0.1: the tests' ``tests/s3_server.py``, loaded from the checkout
distfusion is installed from): ``--data`` is
uploaded once, every engine reads ``s3://tpch/<name>/`` from the same server,
and each engine's requests during its warm-up run of a query are counted
(listings, HEADs, footer reads, other range reads). Data already on an object
store is read with ``--data s3://bucket/prefix`` (stores from the environment).

``--json PATH`` writes everything measured (:func:`run_tpch_bench` documents
the layout); ``--baseline PATH`` compares distfusion's medians with such a file
from an earlier run and flags queries more than :data:`SLOWER_TOLERANCE` slower
(:func:`compare_to_baseline`).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pyarrow as pa
from datafusion import SessionContext
from rich.console import Console
from rich.table import Table

from distfusion import tpch
from distfusion.context import DistributedConfig, DistributedContext
from distfusion.coordinator.statements import plan_statements, split_statements
from distfusion.io import object_store
from distfusion.runtime.registry import runtime_from_name, runtime_options
from distfusion.runtime.spark import SparkConnectRuntime, connect_session
from distfusion.runtime.spark.connect_server import start_connect_server

__all__ = [
    "PEERS",
    "SLOWER_TOLERANCE",
    "BaselineRow",
    "PeakMemory",
    "compare_to_baseline",
    "load_baseline",
    "parse_peers",
    "request_counts",
    "run_tpch_bench",
    "used_memory_bytes",
]

Runner = Callable[[str], pa.Table]
"""Runs one SQL text to completion; returns the result (collected as Arrow)."""

PEERS = ("datafusion", "spark-sql", "local", "flight", "static", "no-metrics", "spark-connect")
"""Peer names ``--peers`` accepts, in display order."""

SLOWER_TOLERANCE = 0.05
"""A query is flagged against a baseline when its median is more than 5% above
the baseline's (issue 17: "no query more than 5% slower than a baseline run")."""

JSON_FORMAT = 1
"""Version of the ``--json`` layout; bumped when a field changes meaning."""


# ------------------------------------------------------------------ peers
def parse_peers(spec: str | None, runtime_name: str) -> list[str]:
    """The peers named by ``--peers`` (comma-separated), in :data:`PEERS` order.

    Args:
        spec: e.g. ``"datafusion,local"``; None means the default: ``datafusion``,
            plus ``spark-sql`` on the Spark runtime. An empty string means none.
        runtime_name: distfusion's runtime (``spark``, ``local``, ``flight``).

    Raises:
        ValueError: an unknown peer name, or ``spark-sql`` or ``spark-connect``
            without the Spark runtime.

    >>> parse_peers(None, "spark")
    ['datafusion', 'spark-sql']
    >>> parse_peers("static, datafusion", "local")
    ['datafusion', 'static']
    """
    if spec is None:
        return ["datafusion", "spark-sql"] if runtime_name == "spark" else ["datafusion"]
    names = {n.strip() for n in spec.split(",") if n.strip()}
    unknown = names - set(PEERS)
    if unknown:
        msg = f"unknown peer(s) {', '.join(sorted(unknown))}; choose from {', '.join(PEERS)}"
        raise ValueError(msg)
    for peer in ("spark-sql", "spark-connect"):
        if peer in names and runtime_name != "spark":
            msg = f"the {peer} peer runs on the Spark runtime's session: use --runtime spark"
            raise ValueError(msg)
    return [p for p in PEERS if p in names]


def _datafusion_runner(data_dir: str) -> Runner:
    ctx = SessionContext()
    if object_store.is_url(data_dir):  # the same stores as distfusion's tasks read with
        object_store.spec_for(data_dir)
        object_store.add_to(ctx)
    tpch.register_tpch(ctx, data_dir)
    return lambda sql: plan_statements(ctx, sql).to_arrow_table()


def _spark_sql_runner(spark, data_dir: str) -> Runner:
    """Spark SQL on distfusion's SparkSession, the same files as temp views.

    The result is collected on the driver as Arrow (``DataFrame.toArrow()``), as
    distfusion's is. Q15's ``create view`` becomes a temporary view (Spark does
    not let a permanent view read temporary ones).
    """
    for table in tpch.TABLES:
        spark.read.parquet(tpch.table_path(data_dir, table)).createOrReplaceTempView(table)

    def run(sql: str) -> pa.Table:
        result = pa.table({})
        for stmt in split_statements(sql):
            stmt = re.sub(r"(?i)^create view", "CREATE OR REPLACE TEMPORARY VIEW", stmt)
            stmt = re.sub(r"(?i)^drop view", "DROP VIEW IF EXISTS", stmt)
            df = spark.sql(stmt)
            if df.columns:
                result = df.toArrow()
        return result

    return run


class DistfusionRunner:
    """A :data:`Runner` over one DistributedContext that keeps the last query's frame.

    :meth:`probe` (the warm-up run) also reports the plan's shape and the adaptive
    decisions the frame exposes after the run (:func:`adaptive_decisions`).
    """

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def __call__(self, sql: str) -> pa.Table:
        """Run ``sql`` to completion; returns the result."""
        return self.ctx.sql(sql).to_arrow_table()

    def probe(self, sql: str) -> tuple[pa.Table, dict, list[str], float]:
        """Run ``sql`` once, and read what it did.

        Returns:
            ``(result, shape, decisions, elapsed)``: see :func:`shape_of` (with
            ``spilled_bytes``: what the tasks' DataFusion operators spilled,
            from ``df.metrics()``) and :func:`adaptive_decisions`; ``elapsed``:
            wall seconds from the query's start to its result (its plan
            explained on the way), not the reading after.
        """
        start = time.perf_counter()
        df = self.ctx.sql(sql)
        before = _explain(df)
        result = df.to_arrow_table()
        elapsed = time.perf_counter() - start
        shape = shape_of(df.stage_graph())
        metrics = df.metrics()
        shape["spilled_bytes"] = sum(s.spilled_bytes for s in metrics.stages) if metrics else 0
        return result, shape, adaptive_decisions(df, before), elapsed


def static_config():
    """``DistributedConfig(adaptive=False)``, and whether the field exists.

    Returns:
        ``(config, has_adaptive)``; without an ``adaptive`` field (a build before
        adaptive execution), the default config and False: static then runs the
        very plans distfusion runs (a measure of noise, nothing more).
    """
    fields = {f.name for f in dataclasses.fields(DistributedConfig)}
    if "adaptive" in fields:
        return DistributedConfig(adaptive=False), True
    return DistributedConfig(), False


def _memory_config(args) -> DistributedConfig:
    """``DistributedConfig`` with ``--memory-per-task`` (``args.memory_per_task``, bytes)."""
    return DistributedConfig(memory_per_task_bytes=getattr(args, "memory_per_task", None))


def _peer_runners(
    peers: list[str], args, runtime, stack: ExitStack, console: Console
) -> dict[str, Runner]:
    """A runner per peer; contexts they open are closed by ``stack``.

    ``static`` shares distfusion's runtime (so it is not closed here: the main
    context owns it); ``local`` gets its own LocalRuntime with ``args.workers``,
    ``flight`` its own FlightRuntime with 3 local worker processes;
    ``spark-connect`` a SparkConnectRuntime on a Connect session to the
    Spark runtime's own application (same executors and task slots).

    Raises:
        ImportError: ``spark-connect`` without pyspark's Connect client.
    """
    runners: dict[str, Runner] = {}
    for peer in peers:
        if peer == "datafusion":
            runners[peer] = _datafusion_runner(args.data)
        elif peer == "spark-sql":
            runners[peer] = _spark_sql_runner(runtime.spark, args.data)
        elif peer in ("local", "flight"):
            workers = args.workers if peer == "local" else None
            own = stack.enter_context(
                DistributedContext(
                    runtime=runtime_from_name(peer, workers), config=_memory_config(args)
                )
            )
            tpch.register_tpch(own, args.data)
            runners[peer] = DistfusionRunner(own)
        elif peer == "static":
            config, has_adaptive = static_config()
            if not has_adaptive:
                console.print(
                    "[yellow]note: DistributedConfig has no `adaptive` field in this build; "
                    "the static peer runs the same plans as distfusion[/]"
                )
            if getattr(args, "memory_per_task", None):
                config = dataclasses.replace(config, memory_per_task_bytes=args.memory_per_task)
            static = DistributedContext(runtime=runtime, config=config)
            tpch.register_tpch(static, args.data)
            runners[peer] = DistfusionRunner(static)
        elif peer == "no-metrics":
            config = dataclasses.replace(_memory_config(args), operator_metrics=False)
            quiet = DistributedContext(runtime=runtime, config=config)
            tpch.register_tpch(quiet, args.data)
            runners[peer] = DistfusionRunner(quiet)
        elif peer == "spark-connect":
            url = start_connect_server(runtime.spark)
            session = connect_session(url)
            stack.callback(session.stop)  # after its context closes, before the application
            remote = SparkConnectRuntime(spark=session, progress=False)
            own = stack.enter_context(
                DistributedContext(runtime=remote, config=_memory_config(args))
            )
            tpch.register_tpch(own, args.data)
            runners[peer] = DistfusionRunner(own)
    return runners


# ------------------------------------------------------------------ plan facts
def shape_of(graph) -> dict:
    """The stage/task shape of a StageGraph, for the JSON output.

    Returns:
        ``{"stages": n, "tasks": total, "tasks_per_stage": [..], "boundaries":
        {kind: count}}``; stages in the graph's order (head first).
    """
    summary = graph.summary()
    return {
        "stages": summary["stages"],
        "tasks": summary["tasks"],
        "tasks_per_stage": [s.num_tasks for s in graph.stages],
        "boundaries": summary["boundaries"],
    }


def describe_shape(shape: dict) -> str:
    """A shape (:func:`shape_of`) in a few words: stages and tasks, or coordinator only."""
    if shape["stages"] == 1:
        return "1 stage: the whole query on the coordinator"
    return f"{shape['stages']} stages, {shape['tasks']} tasks"


def _explain(df) -> str:
    try:
        return df.explain()
    except Exception:  # a frame that cannot render its plan: nothing to compare
        return ""


def adaptive_decisions(df, explain_before: str) -> list[str]:
    """What adaptive execution decided while ``df`` ran, as text lines; [] when unknown.

    Builds before adaptive execution expose nothing, so each source is optional;
    the first one found wins:

    1. an ``adaptive_decisions`` attribute or method of the frame;
    2. an attribute of the frame holding a report with a ``decisions`` list
       (such as ``coordinator.adaptive.AdaptiveReport``);
    3. the lines under an ``Adaptive decisions:`` heading in ``df.explain()``;
    4. the lines ``df.explain()`` shows after the run and did not show before it
       (``explain_before``).
    """
    found = getattr(df, "adaptive_decisions", None)
    if found is not None:
        found = found() if callable(found) else found
        if isinstance(found, str):
            return [line for line in found.splitlines() if line.strip()]
        return [str(d) for d in found or ()]
    for value in getattr(df, "__dict__", {}).values():
        decisions = getattr(value, "decisions", None)
        if isinstance(decisions, list):
            return [str(d) for d in decisions]
    if not explain_before:
        return []
    after = _explain(df).splitlines()
    if "Adaptive decisions:" in after:
        lines = after[after.index("Adaptive decisions:") + 1 :]
        taken = []
        for line in lines:
            if not line.startswith(" "):
                break
            taken.append(line.strip().removeprefix("- "))
        return taken
    seen = set(explain_before.splitlines())
    return [line for line in after if line.strip() and line not in seen]


def git_commit() -> dict | None:
    """The git commit of distfusion's source tree, or None outside a git checkout.

    Returns:
        ``{"commit": sha, "dirty": bool}``; dirty when tracked files differ from it.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": sha, "dirty": bool(status.strip())}


# ------------------------------------------------------------------ baseline
@dataclasses.dataclass(frozen=True)
class BaselineRow:
    """One query against the baseline.

    Attributes:
        query: TPC-H query number.
        now_s: distfusion's median now, seconds.
        baseline_s: the baseline's distfusion median, seconds; None when the
            baseline did not run this query.
        slower: ``now_s > baseline_s * (1 + tolerance)``; False without a baseline.
    """

    query: int
    now_s: float
    baseline_s: float | None
    slower: bool

    @property
    def ratio(self) -> float | None:
        """``now_s / baseline_s`` (above 1: slower now); None without a baseline."""
        return self.now_s / self.baseline_s if self.baseline_s else None


def load_baseline(path: str) -> dict:
    """Read a ``--json`` file of an earlier run.

    Returns:
        The whole document; ``doc["queries"][str(q)]["engines"]["distfusion"]["median_s"]``
        is what :func:`compare_to_baseline` reads.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: not JSON, or no ``queries`` with distfusion medians.
    """
    with open(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as exc:
            msg = f"--baseline {path}: not JSON ({exc})"
            raise ValueError(msg) from exc
    queries = doc.get("queries") if isinstance(doc, dict) else None
    if not isinstance(queries, dict) or not all(
        "median_s" in q.get("engines", {}).get("distfusion", {}) for q in queries.values()
    ):
        msg = f"--baseline {path}: expected the output of `distfusion bench --json`"
        raise ValueError(msg)
    return doc


def compare_to_baseline(
    medians_s: dict[int, float], baseline: dict, tolerance: float = SLOWER_TOLERANCE
) -> list[BaselineRow]:
    """Distfusion's median per query now against a baseline run's.

    Args:
        medians_s: query number -> distfusion's median now, seconds.
        baseline: a document from :func:`load_baseline`.
        tolerance: relative slowdown allowed before a query is flagged (0.05: 5%).

    Returns:
        One row per query in ``medians_s``, in its order.

    >>> base = {"queries": {"1": {"engines": {"distfusion": {"median_s": 1.0}}}}}
    >>> [r.slower for r in compare_to_baseline({1: 1.04, 2: 9.0}, base)]
    [False, False]
    >>> compare_to_baseline({1: 1.06}, base)[0].slower
    True
    """
    rows = []
    for q, now in medians_s.items():
        entry = baseline["queries"].get(str(q))
        base = entry["engines"]["distfusion"]["median_s"] if entry else None
        slower = base is not None and now > base * (1 + tolerance)
        rows.append(BaselineRow(q, now, base, slower))
    return rows


def _print_baseline(
    rows: list[BaselineRow], baseline: dict, path: str, settings: dict, console: Console
) -> None:
    base_commit = (baseline.get("git") or {}).get("commit", "unknown commit")[:12]
    old = baseline.get("settings", {})
    differ = [
        k
        for k in ("data", "runtime", "workers", "num_workers", "master")
        if k in old and old[k] != settings.get(k)
    ]
    if differ:
        console.print(
            f"[yellow]note: the baseline ran with other settings: "
            f"{', '.join(f'{k}={old[k]!r}' for k in differ)}[/]"
        )
    table = Table(
        "query",
        "baseline (s)",
        "now (s)",
        "now / baseline",
        "",
        title=f"distfusion vs baseline {path} ({base_commit})",
    )
    for r in rows:
        if r.baseline_s is None:
            table.add_row(f"Q{r.query}", "-", f"{r.now_s:.3f}", "-", "not in baseline")
            continue
        flag = f"[red]> {SLOWER_TOLERANCE:.0%} slower[/]" if r.slower else ""
        table.add_row(
            f"Q{r.query}", f"{r.baseline_s:.3f}", f"{r.now_s:.3f}", f"{r.ratio:.2f}x", flag
        )
    compared = [(r.now_s, r.baseline_s) for r in rows if r.baseline_s is not None]
    if compared:
        now = sum(n for n, _ in compared)
        base = sum(b for _, b in compared)
        table.add_row("total", f"{base:.3f}", f"{now:.3f}", f"{now / base:.2f}x", "", style="bold")
    console.print(table)
    slower = [r.query for r in rows if r.slower]
    listed = f": {', '.join(f'Q{q}' for q in slower)}" if slower else ""
    console.print(
        f"{len(slower)} of {len(compared)} queries more than {SLOWER_TOLERANCE:.0%} "
        f"slower than the baseline{listed}"
    )


# ------------------------------------------------------------------ the run
def used_memory_bytes() -> int | None:
    """Memory in use on this machine now (``MemTotal - MemAvailable``), bytes; None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemTotal"] - info["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        return None


class PeakMemory:
    """The machine's peak extra memory while a block runs, sampled every ``interval_s``.

    ``with PeakMemory() as peak: ...`` then ``peak.extra_bytes``: the highest
    :func:`used_memory_bytes` seen minus its value at the start (bytes, at least
    0; None where the platform does not say). Every process counts, as in the
    issue's measurements (#14): the workers, Spark's JVM and its Python workers.

    ``extra_bytes`` misses memory a process kept from an earlier run and
    reused (allocators keep freed pages: DataFusion's, Arrow's pools), so
    with ``idle_bytes`` (:func:`used_memory_bytes` before any engine started)
    ``over_idle_bytes`` is the highest use over that: an upper bound that
    also counts what other engines and started workers hold.
    """

    def __init__(self, interval_s: float = 0.2, idle_bytes: int | None = None) -> None:
        self.interval_s = interval_s
        self.idle_bytes = idle_bytes
        self.extra_bytes: int | None = None
        self.over_idle_bytes: int | None = None
        self._stop = threading.Event()
        self._peak: int | None = None
        self._base: int | None = None

    def _sample(self) -> None:
        used = used_memory_bytes()
        if used is not None and (self._peak is None or used > self._peak):
            self._peak = used

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._base = used_memory_bytes()
        self._peak = self._base
        self._thread = threading.Thread(target=self._loop, name="distfusion-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        if self._base is not None and self._peak is not None:
            self.extra_bytes = max(0, self._peak - self._base)
        if self.idle_bytes is not None and self._peak is not None:
            self.over_idle_bytes = max(0, self._peak - self.idle_bytes)


def _time(run: Runner, sql: str, idle_bytes: int | None) -> tuple[float, PeakMemory]:
    """Wall seconds of one run of ``sql``, and the machine's peak memory meanwhile."""
    with PeakMemory(idle_bytes=idle_bytes) as peak:
        start = time.perf_counter()
        run(sql)
        elapsed = time.perf_counter() - start
    return elapsed, peak


def _settings(args, queries: list[int], peers: list[str], runtime) -> dict:
    return {
        "benchmark": "tpch",
        "data": args.data if object_store.is_url(args.data) else os.path.abspath(args.data),
        "runtime": args.runtime,
        "workers": args.workers,
        "num_workers": runtime.num_workers(),
        "master": getattr(args, "master", None),
        "runs": args.runs,
        "warmup": not getattr(args, "no_warmup", False),
        "queries": queries,
        "peers": peers,
        "memory_per_task_bytes": getattr(args, "memory_per_task", None),
        "argv": sys.argv[1:],
    }


def _environment() -> dict:
    versions = {}
    for package in ("datafusion", "pyarrow", "pyspark"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": versions,
    }


def _console() -> Console:
    """Rich's console; 160 columns when not a terminal (a log file), so tables stay whole."""
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 160)
    return console


def _print_results(results: dict, engines: list[str], peers: list[str], console: Console) -> None:
    totals = results["total_s"]
    table = Table(
        "query",
        *engines,
        *[f"/ {p}" for p in peers],
        title="medians in seconds; ratios distfusion / peer (below 1: distfusion faster)",
    )
    for q, r in results["queries"].items():
        med = {e: r["engines"][e]["median_s"] for e in engines}
        table.add_row(
            f"Q{q}",
            *[f"{med[e]:.3f}" for e in engines],
            *[f"{med['distfusion'] / med[p]:.2f}x" for p in peers],
        )
    table.add_row(
        "total",
        *[f"{totals[e]:.3f}" for e in engines],
        *[f"{totals['distfusion'] / totals[p]:.2f}x" for p in peers],
        style="bold",
    )
    console.print(table)
    peaks = []
    for e in engines:
        runs = [r["engines"][e] for r in results["queries"].values()]
        extra = _max([v.get("peak_extra_bytes") for v in runs])
        over = _max([v.get("peak_over_idle_bytes") for v in runs])
        if extra is not None:
            peaks.append(f"{e}{_gib(extra, over)}")
    if peaks:
        console.print("peak memory (+over a run's start/over idle): " + ", ".join(peaks))


def _gib(extra: int | None, over_idle: int | None) -> str:
    if extra is None:
        return ""
    if over_idle is None:
        return f" (+{extra / 2**30:.1f} GiB)"
    return f" (+{extra / 2**30:.1f}/{over_idle / 2**30:.1f} GiB)"


def _max(values: list[int | None]) -> int | None:
    return max((v for v in values if v is not None), default=None)


def answer_digest(table: pa.Table) -> list[tuple]:
    """``table``'s rows as sorted tuples, floats rounded to 9 significant digits.

    Two engines give the same answer when their digests are equal: row order
    is ignored (the TPC-H answers are checked for content; order is
    DataFusion's to keep) and floats may differ in their last digits (a
    distributed sum adds in another order). Decimals, integers and strings
    compare exactly.
    """

    def value(v):
        return f"{v:.9g}" if isinstance(v, float) else v

    rows = [tuple(value(v) for v in row.values()) for row in table.to_pylist()]
    return sorted(rows, key=repr)


def _answers_differ(results: dict[str, pa.Table]) -> list[str]:
    """Engines of ``results`` whose answer is not single-node DataFusion's.

    Only DataFusion-based engines are compared (Spark SQL's types and decimal
    rounding differ: its row count is checked by the caller); [] without a
    ``datafusion`` result.
    """
    if "datafusion" not in results:
        return []
    expected = answer_digest(results["datafusion"])
    return [
        e
        for e, t in results.items()
        if e not in ("datafusion", "spark-sql") and answer_digest(t) != expected
    ]


_S3_SERVER = Path(__file__).resolve().parents[2] / "tests" / "s3_server.py"
"""moto's S3 server of the tests, in the checkout an editable install runs from."""


def _s3_server_class() -> type:
    """``S3Server`` of ``tests/s3_server.py``, loaded from the checkout distfusion runs from.

    The server is test code, outside the installed package (moto is no
    dependency of it): it is there when distfusion is installed from its
    repository (``pip install -e '.[test]'``, as ``make test`` does), not from
    a wheel. Called by ``--local-s3`` only.

    Raises:
        ImportError: no ``tests/s3_server.py`` there (says what to install and run).
    """
    if not _S3_SERVER.is_file():
        msg = (
            "--local-s3 runs the tests' local S3 server (tests/s3_server.py of distfusion's "
            f"repository, moto's), which is not part of the installed package (no {_S3_SERVER}): "
            "install distfusion from a checkout (pip install -e '.[test]') and run "
            "distfusion bench from that install, or read data already on an object store "
            "with --data s3://bucket/prefix"
        )
        raise ImportError(msg)
    spec = importlib.util.spec_from_file_location("distfusion_tests_s3_server", _S3_SERVER)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {_S3_SERVER} as a module (the tests' S3 server)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.S3Server


def _local_s3(data_dir: str, console: Console):
    """A local S3 server holding ``data_dir`` as ``s3://tpch/<its name>/``; (server, URL).

    Workers read it with credentials from the environment (moto takes any:
    set here when none are); its store is registered for every engine.

    Raises:
        ImportError: moto or boto3 is missing (the test extra), or distfusion is
            not installed from a checkout (:func:`_s3_server_class`).
    """
    for var, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench")):
        os.environ.setdefault(var, value)  # before any worker or JVM starts
    server = _s3_server_class()()
    name = os.path.basename(os.path.abspath(data_dir))
    start = time.perf_counter()
    server.create_bucket("tpch")
    server.upload_dir(data_dir, "tpch", name)
    store = object_store.AmazonS3(bucket_name="tpch", endpoint=server.endpoint, allow_http=True)
    object_store.register("s3://", store, "tpch")
    console.print(
        f"local S3 server {server.endpoint}: {data_dir} uploaded as s3://tpch/{name}/ "
        f"in {time.perf_counter() - start:.1f} s"
    )
    return server, f"s3://tpch/{name}"


def request_counts(requests: list[dict]) -> dict:
    """Requests of an S3 server's log by kind.

    Returns:
        ``{"list", "head", "footer", "range", "other"}`` counts: ``footer`` is
        a GET of a byte range ending at the object's last byte, ``range`` any
        other GET; plus ``"max_footers_per_file"``: the most footer reads of one
        object (1 when every footer is read once).
    """
    counts = {"list": 0, "head": 0, "footer": 0, "range": 0, "other": 0}
    footers: dict[str, int] = {}
    for r in requests:
        if r["method"] == "HEAD":
            counts["head"] += 1
        elif r["method"] == "GET" and "list-type" in r.get("query", ""):
            counts["list"] += 1
        elif r["method"] == "GET":
            span, _, total = r.get("content_range", "x-0/0").split()[-1].partition("/")
            if total and int(span.split("-")[1]) == int(total) - 1:
                counts["footer"] += 1
                footers[r["path"]] = footers.get(r["path"], 0) + 1
            else:
                counts["range"] += 1
        else:
            counts["other"] += 1
    counts["max_footers_per_file"] = max(footers.values(), default=0)
    return counts


def _round_order(engines: dict, i: int) -> list:
    """The engines of timed round ``i``: in order on even rounds, reversed on odd ones.

    An engine run right after Spark SQL shares the two cores with the JVM's
    work after that query (its compilation, its GC): in a fixed order the same
    engine would pay for it in every round (TPC-H SF1: distfusion on Spark
    right after Spark SQL in each round took 1.17x DataFusion's time; in a run
    where it came after the local runtime, 1.03x). Alternating puts each
    engine after a different one in turn.
    """
    items = list(engines.items())
    return items if i % 2 == 0 else items[::-1]


def _measure_query(
    q: int,
    engines: dict[str, Runner],
    runs: int,
    console: Console,
    idle_bytes: int | None = None,
    server=None,
    warmup: bool = True,
) -> dict:
    """Warm up every engine on query ``q``, then ``runs`` interleaved timed runs.

    The timed rounds alternate the engines' order (:func:`_round_order`).

    Without ``warmup``, that first run of each engine is timed too and counts
    as the first of the ``runs``. The first run's results are checked: every
    engine's row count, and each DataFusion-based engine's answer against
    single-node DataFusion's (:func:`answer_digest`; a difference is printed
    in red and listed under ``answers_differ``).

    Returns:
        ``{"rows": n, "answers_differ": [engine, ...],
        "engines": {engine: {"runs_s": [...], "median_s": s}},
        "shapes": {engine: shape}, "adaptive_decisions": {engine: [line, ...]}}``;
        shapes and decisions only for distfusion engines (distfusion, local,
        static, no-metrics).

    Raises:
        RuntimeError: the engines disagree on the row count.
    """
    sql = tpch.query(q)
    results, shapes, decisions, requests = {}, {}, {}, {}
    times: dict[str, list[float]] = {e: [] for e in engines}
    peaks: dict[str, list[PeakMemory]] = {e: [] for e in engines}
    for e, run in engines.items():  # the first run: warm-up, or timed without one
        if server is not None:
            server.clear_requests()
        with PeakMemory(idle_bytes=idle_bytes) as peak:
            start = time.perf_counter()
            if isinstance(run, DistfusionRunner):
                results[e], shapes[e], decisions[e], elapsed = run.probe(sql)
            else:
                results[e] = run(sql)
                elapsed = time.perf_counter() - start
        if not warmup:
            times[e].append(elapsed)
            peaks[e].append(peak)
        if server is not None:
            requests[e] = request_counts(server.requests())
    rows = {e: t.num_rows for e, t in results.items()}
    if len(set(rows.values())) != 1:
        msg = f"Q{q}: engines disagree on the row count: {rows}"
        raise RuntimeError(msg)
    differ = _answers_differ(results)
    if differ:
        console.print(f"[bold red]Q{q}: answers differ from single-node DataFusion: {differ}[/]")
    for i in range(runs if warmup else runs - 1):
        for e, run in _round_order(engines, i):
            elapsed, peak = _time(run, sql, idle_bytes)
            times[e].append(elapsed)
            peaks[e].append(peak)
    result = {
        "rows": rows["distfusion"],
        "answers_differ": differ,
        "engines": {
            e: {
                "runs_s": t,
                "median_s": statistics.median(t),
                "peak_extra_bytes": _max([p.extra_bytes for p in peaks[e]]),
                "peak_over_idle_bytes": _max([p.over_idle_bytes for p in peaks[e]]),
            }
            for e, t in times.items()
        },
        "shapes": shapes,
        "adaptive_decisions": {e: d for e, d in decisions.items() if d},
    }
    if requests:
        result["requests"] = requests
    line = "  ".join(
        f"{e} {v['median_s']:.3f}" + _gib(v["peak_extra_bytes"], v["peak_over_idle_bytes"])
        for e, v in result["engines"].items()
    )
    spilled = shapes["distfusion"].get("spilled_bytes", 0)
    spill = f", {spilled / 2**20:.0f} MiB spilled" if spilled else ""
    console.print(f"Q{q:<2} {line}  ({describe_shape(shapes['distfusion'])}{spill})")
    if requests:
        text = ", ".join(
            f"{e} {c['list']}/{c['head']}/{c['footer']}/{c['range']}" for e, c in requests.items()
        )
        console.print(f"    S3 requests (list/head/footer/range): {text}")
    for e, lines in result["adaptive_decisions"].items():
        if len(lines) == 1:
            console.print(f"    adaptive ({e}): {lines[0]}", markup=False, highlight=False)
            continue
        console.print(f"    adaptive ({e}):")
        for text in lines:
            console.print(f"      {text}", markup=False, highlight=False)
    return result


def run_tpch_bench(args, queries: list[int], console: Console | None = None) -> dict:
    """Run the benchmark described by CLI ``args`` over ``queries``; print and return it.

    ``args`` carries ``data``, ``runtime``, ``workers``, ``runs``, and optionally
    ``peers`` (``--peers`` text), ``json`` (a path to write the result to) and
    ``baseline`` (a path to an earlier result).

    Returns:
        The JSON document (also written to ``args.json`` when given)::

            {"format": 1, "started_at": ISO time, "git": {"commit", "dirty"} | None,
             "settings": {data, runtime, workers, num_workers, master, runs,
                          queries, peers, memory_per_task_bytes, argv,
                          static_adaptive_field},
             "environment": {python, platform, cpus, versions},
             "queries": {"1": {"rows": n,
                               "engines": {engine: {"runs_s": [s, ...], "median_s": s,
                                                    "peak_extra_bytes": bytes | None,
                                                    "peak_over_idle_bytes": bytes | None}},
                               "shapes": {engine: {stages, tasks, tasks_per_stage, boundaries,
                                                   spilled_bytes}},
                               "adaptive_decisions": {engine: [line, ...]}}, ...},
             "total_s": {engine: sum of medians},
             "ratios": {peer: total distfusion / total peer},
             "baseline": {"path", "commit", "slower": [q, ...],
                          "queries": {"1": {"now_s", "baseline_s", "slower"}}}}  # with --baseline

        Times are wall-clock seconds; ``engine`` is ``distfusion`` or a peer name;
        ``peak_extra_bytes`` is the machine's highest extra memory in use during
        the engine's timed runs of the query over its use when the run started,
        ``peak_over_idle_bytes`` the same over its use before the benchmark
        started any engine (an upper bound: see :class:`PeakMemory`; every
        process counted; None off Linux). The console shows both, ``(+extra/over idle GiB)``.

    Raises:
        RuntimeError: an engine returned a different row count than the others.
        ValueError: bad ``--peers``, or a ``--baseline`` file that is no bench result.
        FileNotFoundError: no ``--baseline`` file.
    """
    console = console or _console()
    peers = parse_peers(getattr(args, "peers", None), args.runtime)
    baseline_path = getattr(args, "baseline", None)
    baseline = load_baseline(baseline_path) if baseline_path else None  # fail before running
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    server = None
    if getattr(args, "local_s3", False):
        if "spark-sql" in peers:
            console.print(
                "[yellow]note: Spark SQL cannot read s3a:// here (no hadoop-aws jar); "
                "the spark-sql peer is left out[/]"
            )
            peers = [p for p in peers if p != "spark-sql"]
        server, args.data = _local_s3(args.data, console)
    idle = used_memory_bytes()  # before any engine, worker or JVM starts
    runtime = runtime_from_name(args.runtime, args.workers, **runtime_options(args))
    with ExitStack() as stack:
        if server is not None:
            stack.callback(server.stop)
        ctx = stack.enter_context(DistributedContext(runtime=runtime, config=_memory_config(args)))
        tpch.register_tpch(ctx, args.data)
        engines: dict[str, Runner] = {
            "distfusion": DistfusionRunner(ctx),
            **_peer_runners(peers, args, runtime, stack, console),
        }
        settings = _settings(args, queries, peers, runtime)
        settings["static_adaptive_field"] = static_config()[1]
        console.print(
            f"TPC-H at {args.data}: distfusion on the {args.runtime} runtime "
            f"({runtime.num_workers()} workers) vs {', '.join(peers) or 'no peer'}; "
            f"{args.runs} timed runs per query, medians in seconds"
        )
        per_query = {
            str(q): _measure_query(
                q,
                engines,
                args.runs,
                console,
                idle,
                server,
                warmup=not getattr(args, "no_warmup", False),
            )
            for q in queries
        }
    totals = {e: sum(r["engines"][e]["median_s"] for r in per_query.values()) for e in engines}
    doc = {
        "format": JSON_FORMAT,
        "started_at": started,
        "git": git_commit(),
        "settings": settings,
        "environment": _environment(),
        "queries": per_query,
        "total_s": totals,
        "ratios": {p: totals["distfusion"] / totals[p] for p in peers if totals[p]},
    }
    _print_results(doc, list(engines), peers, console)
    if baseline is not None and baseline_path:
        medians = {q: per_query[str(q)]["engines"]["distfusion"]["median_s"] for q in queries}
        rows = compare_to_baseline(medians, baseline)
        _print_baseline(rows, baseline, baseline_path, settings, console)
        doc["baseline"] = {
            "path": os.path.abspath(baseline_path),
            "commit": (baseline.get("git") or {}).get("commit"),
            "slower": [r.query for r in rows if r.slower],
            "queries": {
                str(r.query): {"now_s": r.now_s, "baseline_s": r.baseline_s, "slower": r.slower}
                for r in rows
            },
        }
    json_path = getattr(args, "json", None)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        console.print(f"wrote {json_path}")
    return doc
