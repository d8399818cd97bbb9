"""``pip install 'distfusion[delta]'``: a Delta table written with deltalake, read natively.

Usage: ``python check_delta.py WORK_DIR``.
"""

import sys
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from distfusion import DistributedContext, LocalRuntime

work = Path(sys.argv[1])
path = str(work / "delta")
write_deltalake(path, pa.table({"k": [1, 2, 2], "v": [1.5, 2.5, 3.0]}))
write_deltalake(path, pa.table({"k": [3], "v": [4.0]}), mode="append")
ctx = DistributedContext(runtime=LocalRuntime(workers=2))
ctx.register_delta("t", path)
rows = ctx.sql("SELECT k, sum(v) AS s FROM t GROUP BY k ORDER BY k").to_pylist()
assert rows == [{"k": 1, "s": 1.5}, {"k": 2, "s": 5.5}, {"k": 3, "s": 4.0}], rows
print("ok")
