"""``pip install distfusion``: SQL on the local runtime and on Flight workers; to_pandas says what it needs.

Usage: ``python check_core.py WORK_DIR``.
"""

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from distfusion import DistributedConfig, DistributedContext, FlightRuntime, LocalRuntime

work = Path(sys.argv[1])
pq.write_table(
    pa.table({"k": [i % 5 for i in range(1000)], "v": list(range(1000))}), work / "t.parquet"
)
SQL = "SELECT a.k, count(*) AS n, sum(b.v) AS s FROM t a JOIN t b ON a.v = b.v GROUP BY a.k ORDER BY a.k"
EXPECTED = [{"k": k, "n": 200, "s": sum(range(k, 1000, 5))} for k in range(5)]
config = DistributedConfig(tasks_per_stage=2, broadcast_threshold_bytes=0)
for runtime in (LocalRuntime(workers=2), FlightRuntime.with_local_workers(2)):
    try:
        ctx = DistributedContext(runtime=runtime, config=config)
        ctx.register_parquet("t", str(work / "t.parquet"))
        assert ctx.sql(SQL).to_pylist() == EXPECTED, runtime
    finally:
        runtime.close()
try:
    import pandas  # noqa: F401
except ImportError:  # no dependency of the core: to_pandas says what to install
    ctx = DistributedContext(runtime=LocalRuntime(workers=1))
    ctx.register_parquet("t", str(work / "t.parquet"))
    try:
        ctx.sql("SELECT 1").to_pandas()
    except ImportError as exc:
        assert "pip install pandas" in str(exc), exc
    else:
        raise AssertionError("to_pandas without pandas")
print("ok")
