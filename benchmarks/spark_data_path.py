"""Per-byte cost of every hop of the Spark runtime's data path, on TPC-H lineitem.

A shuffled stage output travels:

```
 DataFusion batches ──encode──> Arrow IPC ──pickle──> Python worker ──socket──> JVM
   (run_task)          (_output_records)  (PySpark)                           │
                                                              shuffle write (compress, disk)
                                                              shuffle read  (decompress)
 batches <──decode── IPC <──unpickle── Python worker <──socket── JVM <────────┘
```

Each hop is timed alone where it can be (in-process hops), or as a Spark job that
stops after it (``rdd._jrdd.count()`` counts in the JVM, so no bytes come back
to Python), and the difference of two jobs gives the hop between them. Every
number is the median of ``--repeat`` runs; rates are MiB/s and seconds per GiB
of uncompressed Arrow IPC payload.

Run (20-40 minutes at SF1 on 2 busy cores; `--sections` and `--repeat` shorten it)::

    .venv/bin/python benchmarks/spark_data_path.py --data data/tpch-sf1
    .venv/bin/python benchmarks/spark_data_path.py --data data/tpch-sf1 --sections spark

Sections: ``local`` (DataFusion, encode, decode, pickle), ``spark`` (PySpark
serialization, JVM shuffle, back to Python, alternatives: raw bytes,
``mapInArrow``), ``conf`` (shuffle compression codecs and block sizes),
``chunks`` (record size), ``flight`` (Arrow Flight ``do_get`` on 127.0.0.1).
Results go to stdout as a Markdown table and, with ``--json``, to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from distfusion.worker.spark_records import _decode, _encode, _output_records  # noqa: E402
from distfusion.stages import SHUFFLE  # noqa: E402
from distfusion.worker.execute_task import partition_output, without_views  # noqa: E402

MiB = 2**20
GiB = 2**30
DEFAULT_COLUMNS = (
    "l_orderkey, l_partkey, l_suppkey, l_linenumber, l_quantity, l_extendedprice, "
    "l_discount, l_shipdate, l_returnflag, l_shipmode, l_comment"
)
ROWS: list[dict] = []


# ---------------------------------------------------------------------- timing
def timed(fn, repeat: int) -> tuple[float, list[float]]:
    """Median seconds of ``repeat`` calls of ``fn`` (and every run)."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), runs


def record(section: str, hop: str, variant: str, nbytes: int, seconds: float, runs, note=""):
    """One result row; ``nbytes`` is the uncompressed IPC payload the hop moved."""
    row = {
        "section": section,
        "hop": hop,
        "variant": variant,
        "MiB": round(nbytes / MiB, 1),
        "median_s": round(seconds, 3),
        "MiB_per_s": round(nbytes / MiB / seconds, 1) if seconds > 0 else None,
        "s_per_GiB": round(seconds / (nbytes / GiB), 3) if nbytes else None,
        "runs_s": [round(r, 3) for r in runs],
        "note": note,
    }
    ROWS.append(row)
    print(
        f"| {section} | {hop} | {variant} | {row['MiB']} | {row['median_s']} | "
        f"{row['MiB_per_s']} | {row['s_per_GiB']} | {note} |",
        flush=True,
    )
    return row


# ---------------------------------------------------------------------- data
def load(data: Path, columns: str, partitions: int, target_partitions: int):
    """lineitem columns hash-partitioned like a shuffle stage (``partition_output``).

    Returns (parts, seconds): one list of RecordBatch per output partition.
    """
    from datafusion import SessionConfig, SessionContext

    ctx = SessionContext(SessionConfig().with_target_partitions(target_partitions))
    ctx.register_parquet("lineitem", str(data / "lineitem"))
    df = ctx.sql(f"SELECT {columns} FROM lineitem")
    plan = types.SimpleNamespace(
        output=types.SimpleNamespace(
            kind=SHUFFLE, num_partitions=partitions, key_columns=(0,), num_columns=None
        )
    )
    # num_columns=None would break the keep slice; use every column.
    plan.output.num_columns = len(df.schema())
    t0 = time.perf_counter()
    parts = partition_output(df, plan, lambda: False)
    return parts, time.perf_counter() - t0


def split_tasks(parts, tasks: int):
    """Per task, per partition, a contiguous share of each partition's batches."""
    out = [[[] for _ in parts] for _ in range(tasks)]
    for p, batches in enumerate(parts):
        for i, b in enumerate(batches):
            out[i * tasks // max(1, len(batches))][p].append(without_views(b))
    return out


def payload_bytes(records) -> int:
    return sum(len(r[1][1]) for r in records)


# ---------------------------------------------------------------------- local hops
def local_section(args, parts, task_parts):
    n = sum(b.nbytes for bs in parts for b in bs)
    sec, runs = timed(lambda: load(args.data, args.columns, args.partitions, 2), args.repeat)
    record("local", "DataFusion scan+hash partition", "2 threads", n, sec, runs, "Arrow nbytes")
    whole = [
        list(_output_records(t, tp, None, 2**62)) for t, tp in enumerate(task_parts)
    ]
    ipc = sum(payload_bytes(r) for r in whole)

    def encode(compression, copy):
        for tp in task_parts:
            for batches in tp:
                if not batches:
                    continue
                sink = pa.BufferOutputStream()
                opts = pa.ipc.IpcWriteOptions(compression=compression)
                with pa.ipc.new_stream(sink, batches[0].schema, options=opts) as w:
                    for b in batches:
                        w.write_batch(b)
                buf = sink.getvalue()
                if copy:
                    buf.to_pybytes()

    for compression in (None, "lz4", "zstd"):
        for copy in (True, False):
            sec, runs = timed(lambda c=compression, k=copy: encode(c, k), args.repeat)
            record(
                "local", "IPC encode", f"{compression or 'none'}, to_pybytes={copy}", ipc, sec, runs
            )
    for chunk in (MiB, 4 * MiB, 16 * MiB):
        sec, runs = timed(
            lambda c=chunk: [
                list(_output_records(t, tp, None, c)) for t, tp in enumerate(task_parts)
            ],
            args.repeat,
        )
        record("local", "IPC encode (_output_records)", f"none, chunk {chunk // MiB} MiB", ipc,
               sec, runs)
    for compression in (None, "lz4", "zstd"):
        enc = [list(_output_records(t, tp, compression, 16 * MiB)) for t, tp in
               enumerate(task_parts)]
        size = sum(payload_bytes(r) for r in enc)
        values = [(t, ipc_) for recs in enc for _, (t, ipc_) in recs]
        sec, runs = timed(lambda v=values: _decode(v), args.repeat)
        record("local", "IPC decode (_decode)", compression or "none", ipc, sec, runs,
               f"wire {size / MiB:.0f} MiB ({size / ipc:.2f}x)")
        if compression is None:
            # _decode is zero-copy; touching every buffer shows the real read cost
            sec, runs = timed(lambda v=values: pa.Table.from_batches(_decode(v)).combine_chunks(),
                              args.repeat)
            record("local", "IPC decode + combine_chunks", "none", ipc, sec, runs, "touches bytes")
    recs = [r for rs in whole for r in rs]
    tagged = [(p, (0,) + v) for p, v in recs]
    sec, runs = timed(lambda: pickle.dumps(tagged, pickle.HIGHEST_PROTOCOL), args.repeat)
    record("local", "pickle.dumps records", "bytes payloads", ipc, sec, runs)
    blob = pickle.dumps(tagged, pickle.HIGHEST_PROTOCOL)
    sec, runs = timed(lambda: pickle.loads(blob), args.repeat)
    record("local", "pickle.loads records", "bytes payloads", ipc, sec, runs)
    del blob


# ---------------------------------------------------------------------- Spark jobs
def write_task_files(tmp: Path, task_parts, compression, chunk_bytes) -> tuple[list[str], int]:
    """Each task's records pickled to a file; Spark tasks read them (page cache)."""
    files, total = [], 0
    for t, tp in enumerate(task_parts):
        recs = list(_output_records(t, tp, compression, chunk_bytes))
        total += payload_bytes(recs)
        f = tmp / f"task-{t}-{compression}-{chunk_bytes}.pkl"
        with open(f, "wb") as fh:
            pickle.dump(recs, fh, pickle.HIGHEST_PROTOCOL)
        files.append(str(f))
    return files, total


def _reader(files):
    def read(t):
        import pickle as _p

        with open(files[t], "rb") as fh:
            return _p.load(fh)

    return read


def spark_jobs(sc, spark, files, n, repeat, section, variant, total, which, sent=None):
    """Time the Spark jobs named in ``which`` over the task files ``files``.

    ``total``: uncompressed payload bytes (the rates' unit); ``sent``: the bytes
    of the files' payloads (smaller with IPC compression), checked on arrival.
    """
    from pyspark.rdd import RDD
    from pyspark.serializers import NoOpSerializer, pack_long

    read = _reader(files)
    tasks = len(files)
    identity = lambda p: p  # noqa: E731

    def base():
        return sc.parallelize(range(tasks), tasks)

    def records_rdd():
        return base().mapPartitions(lambda it: (r for t in it for r in read(t)))

    def consume(it):
        size = 0
        for rec in it:
            size += len(rec[1][2])
        yield size

    def raw_producer(_, it):
        import struct

        for t in it:
            for p, (task, blob) in read(t):
                yield pack_long(p)
                yield struct.pack("<ii", 0, task) + blob

    def raw_consume(it):
        size = 0
        for v in it:
            size += len(memoryview(v)[8:])
        yield size

    jobs = {
        "baseline": lambda: base().mapPartitions(lambda it: [len(read(t)) for t in it]).collect(),
        "py->JVM pickled": lambda: records_rdd()._jrdd.count(),
        "py->JVM raw": lambda: _raw_count(base(), read),
        "shuffle (JVM count)": lambda: records_rdd()
        .map(lambda r: (r[0], (0,) + r[1]))
        .partitionBy(n, identity)
        ._jrdd.count(),
        "full path pickled": lambda: sum(
            records_rdd()
            .map(lambda r: (r[0], (0,) + r[1]))
            .partitionBy(n, identity)
            .mapPartitions(consume)
            .collect()
        ),
        "full path raw": lambda: sum(
            RDD(_raw_shuffle(sc, base(), raw_producer, n), sc, NoOpSerializer())
            .mapPartitions(raw_consume)
            .collect()
        ),
        "mapInArrow + SQL shuffle": lambda: _map_in_arrow(spark, read, tasks, n),
        "collect to driver": lambda: sum(len(r[1][1]) for r in records_rdd().collect()),
    }
    for name in which:  # a first run each: checks the bytes, warms the JVM and the workers
        got = jobs[name]()
        if name.startswith("full path") and got != (sent or total):
            msg = f"{name}: {got} bytes arrived, {sent or total} sent"
            raise AssertionError(msg)
    # Interleaved rounds: the machine is shared, so load drifts; every variant
    # sees the same drift and the ratios between them stay meaningful.
    runs: dict[str, list[float]] = {name: [] for name in which}
    for _ in range(repeat):
        for name in which:
            t0 = time.perf_counter()
            jobs[name]()
            runs[name].append(time.perf_counter() - t0)
    out = {}
    for name in which:
        out[name] = statistics.median(runs[name])
        record(section, name, variant, total, out[name], runs[name])
    return out


def _raw_count(base, read):
    def produce(it):
        for t in it:
            for _, (_, blob) in read(t):
                yield blob

    rdd = base.mapPartitions(produce)
    rdd._bypass_serializer = True
    return rdd._jrdd.count()


def _raw_shuffle(sc, base, producer, n):
    """PySpark's partitionBy without pickle: key = partition, value = one payload."""
    keyed = base.mapPartitionsWithIndex(producer)
    keyed._bypass_serializer = True
    jvm = sc._jvm
    pair = jvm.PairwiseRDD(keyed._jrdd.rdd()).asJavaPairRDD()
    partitioner = jvm.PythonPartitioner(n, 0)
    return jvm.PythonRDD.valueOfPair(pair.partitionBy(partitioner))


def _map_in_arrow(spark, read, tasks, n):
    def produce(it):
        import pyarrow as _pa

        for batch in it:
            for t in batch.column(0).to_pylist():
                for p, (task, blob) in read(t):
                    offsets = _pa.array([0, len(blob)], _pa.int32()).buffers()[1]
                    payload = _pa.Array.from_buffers(
                        _pa.binary(), 1, [None, offsets, _pa.py_buffer(blob)]
                    )  # no copy of the payload
                    yield _pa.record_batch(
                        [_pa.array([p], _pa.int32()), _pa.array([task], _pa.int32()), payload],
                        names=["p", "t", "payload"],
                    )

    def consume(it):
        import pyarrow as _pa
        import pyarrow.compute as _pc

        size = 0
        for batch in it:
            size += _pc.sum(_pc.binary_length(batch.column(2))).as_py() or 0
        yield _pa.record_batch([_pa.array([size], _pa.int64())], names=["n"])

    df = spark.range(0, tasks, 1, tasks).mapInArrow(produce, "p int, t int, payload binary")
    return sum(r[0] for r in df.repartition(n, "p").mapInArrow(consume, "n long").collect())


def start_spark(conf: dict[str, str]):
    from distfusion.runtime.spark import SparkRuntime

    runtime = SparkRuntime(master="local[2]", conf={"spark.driver.memory": "6g", **conf})
    return runtime


def spark_section(args, task_parts, tmp):
    runtime = start_spark({})
    try:
        sc, spark = runtime.sc, runtime.spark
        files, total = write_task_files(tmp, task_parts, None, args.chunk_mib * MiB)
        which = ["baseline", "py->JVM pickled", "py->JVM raw", "shuffle (JVM count)",
                 "full path pickled", "full path raw", "mapInArrow + SQL shuffle",
                 "collect to driver"]
        spark_jobs(sc, spark, files, args.partitions, args.repeat, "spark",
                   f"lz4 32k, chunk {args.chunk_mib} MiB", total, which)
    finally:
        runtime.close()


CONFS = {
    "lz4 32k (default)": {},
    "lz4 256k": {"spark.io.compression.lz4.blockSize": "256k"},
    "zstd": {"spark.io.compression.codec": "zstd"},
    "shuffle.compress=false": {"spark.shuffle.compress": "false"},
}


def conf_section(args, task_parts, tmp):
    files, total = write_task_files(tmp, task_parts, None, args.chunk_mib * MiB)
    lz4_files, lz4_total = write_task_files(tmp, task_parts, "lz4", args.chunk_mib * MiB)
    for name, conf in CONFS.items():
        if args.confs and name.split()[0] not in args.confs.split(","):
            continue
        runtime = start_spark(conf)
        try:
            spark_jobs(runtime.sc, runtime.spark, files, args.partitions, args.repeat, "conf",
                       f"{name}, IPC none", total,
                       ["baseline", "shuffle (JVM count)", "full path pickled"])
            if name in ("shuffle.compress=false", "lz4 32k (default)"):
                spark_jobs(runtime.sc, runtime.spark, lz4_files, args.partitions, args.repeat,
                           "conf", f"{name}, IPC lz4", total,
                           ["shuffle (JVM count)", "full path pickled"], sent=lz4_total)
        finally:
            runtime.close()


def chunks_section(args, task_parts, tmp):
    runtime = start_spark({})
    try:
        for chunk in [int(c) if c != "whole" else None for c in args.chunks.split(",")]:
            chunk_bytes = chunk * MiB if chunk else 2**62
            files, total = write_task_files(tmp, task_parts, None, chunk_bytes)
            recs = sum(len(pickle.load(open(f, "rb"))) for f in files)
            label = f"chunk {chunk} MiB" if chunk else "whole partition"
            spark_jobs(runtime.sc, runtime.spark, files, args.partitions, args.repeat, "chunks",
                       f"{label} ({recs} records)", total,
                       ["full path pickled", "full path raw"])
    finally:
        runtime.close()


# ---------------------------------------------------------------------- Flight
def flight_section(args, task_parts):
    import pyarrow.flight as flight

    batches = [b for tp in task_parts for bs in tp for b in bs]
    total = sum(b.nbytes for b in batches)
    schema = batches[0].schema

    class Server(flight.FlightServerBase):
        def do_get(self, context, ticket):
            compression = ticket.ticket.decode() or None
            opts = pa.ipc.IpcWriteOptions(compression=compression)
            return flight.RecordBatchStream(
                pa.RecordBatchReader.from_batches(schema, iter(batches)), options=opts
            )

    server = Server("grpc://127.0.0.1:0")
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    client = flight.connect(f"grpc://127.0.0.1:{server.port}")
    try:
        for compression in ("", "lz4", "zstd"):
            def get(c=compression):
                return client.do_get(flight.Ticket(c.encode())).read_all()

            get()
            sec, runs = timed(get, args.repeat)
            record("flight", "do_get 127.0.0.1 (server in-process)", compression or "none",
                   total, sec, runs, "one stream")

            def two(c=compression):
                ts = [threading.Thread(target=get, args=(c,)) for _ in range(2)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()

            sec, runs = timed(two, args.repeat)
            record("flight", "do_get 127.0.0.1 x2 streams", compression or "none",
                   2 * total, sec, runs, "two concurrent streams")
    finally:
        client.close()
        server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / "data" / "tpch-sf1")
    parser.add_argument("--columns", default=DEFAULT_COLUMNS)
    parser.add_argument("--tasks", type=int, default=8, help="producer tasks")
    parser.add_argument("--partitions", type=int, default=2, help="consumer tasks")
    parser.add_argument("--chunk-mib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sections", default="local,spark,conf,chunks,flight")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--confs", default="", help="conf section: first words of CONFS names")
    parser.add_argument("--chunks", default="1,4,16,64,whole", help="chunks section: MiB")
    args = parser.parse_args()
    sections = args.sections.split(",")

    parts, _ = load(args.data, args.columns, args.partitions, 2)
    task_parts = split_tasks(parts, args.tasks)
    n = sum(b.nbytes for bs in parts for b in bs)
    print(f"data: {args.data} lineitem ({args.columns}); {n / MiB:.0f} MiB Arrow, "
          f"{args.tasks} producer tasks x {args.partitions} partitions; repeat {args.repeat}")
    print("| section | hop | variant | MiB | median s | MiB/s | s/GiB | note |")
    print("|---|---|---|---|---|---|---|---|")
    tmp = Path(tempfile.mkdtemp(prefix="spark-data-path-"))
    try:
        if "local" in sections:
            local_section(args, parts, task_parts)
        if "flight" in sections:
            flight_section(args, task_parts)
        if "spark" in sections:
            spark_section(args, task_parts, tmp)
        if "conf" in sections:
            conf_section(args, task_parts, tmp)
        if "chunks" in sections:
            chunks_section(args, task_parts, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if args.json:
            args.json.write_text(json.dumps(ROWS, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
