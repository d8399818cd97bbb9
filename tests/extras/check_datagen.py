"""``pip install 'distfusion[datagen]'``: ``distfusion datagen tpch``, then a TPC-H query.

Usage: ``python check_datagen.py WORK_DIR``.
"""

import subprocess
import sys
from pathlib import Path

from distfusion import DistributedContext, LocalRuntime, tpch

work = Path(sys.argv[1])
cli = Path(sys.executable).parent / "distfusion"
out = work / "tpch"
subprocess.run([str(cli), "datagen", "tpch", "--scale", "0.01", "--out", str(out)], check=True)
ctx = DistributedContext(runtime=LocalRuntime(workers=2))
tpch.register_tpch(ctx, out)
rows = ctx.sql(tpch.query(1)).to_pylist()
assert len(rows) == 4 and sum(r["count_order"] for r in rows) > 50_000, rows
print("ok")
